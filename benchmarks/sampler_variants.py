"""Compare SurrogateSampler options side by side on recordings, through `surrotune bench`'s loop.

    python3 benchmarks/sampler_variants.py --datasets FILE... --variant NAME:OPTION=VALUE[,...] \
        [--variant ...] --seeds 20 --budget 200 --jobs 2 -o OUT

Each ``--variant`` is a label and the sampler attributes it sets (``plain`` sets none), e.g.
``thompson:thompson_share=0.3``. The report (bench.md, runs.jsonl) is `surrotune bench`'s, so
the numbers compare with docs/BENCHMARKS.md's; ``--resume`` keeps finished runs.
"""

from __future__ import annotations

import argparse
import ast
import shlex
import sys

from surrotune.bench.harness import SamplerSpec, run_bench


def parse_variant(text: str) -> SamplerSpec:
    """``label:name=value,name=value`` as a surrogate SamplerSpec with those attributes."""
    label, _, options = text.partition(":")
    attrs = []
    for part in filter(None, _top_level_split(options)):
        name, _, value = part.partition("=")
        attrs.append((name.strip(), ast.literal_eval(value.strip())))
    return SamplerSpec("surrogate", label, (("attrs", tuple(attrs)),) if attrs else ())


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes, so that an option's value may
    be a dict or a tuple (``feasibility_params={'a': 1, 'b': 2}``)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--run-timeout", type=float, default=600.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    specs = [parse_variant(v) for v in args.variant]
    run_bench(
        args.datasets, specs, args.budget, args.seeds, args.out, jobs=args.jobs,
        time_limit_s=args.run_timeout, plots=False, resume=args.resume,
        command=shlex.join(["python3", *sys.argv]),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
