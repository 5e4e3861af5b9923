"""Compare SurrogateSampler options side by side on recordings, through `surrotune bench`'s loop.

    python3 benchmarks/sampler_variants.py --datasets FILE... --variant NAME:OPTION=VALUE[,...] \
        [--variant ...] --seeds 20 --budget 200 --jobs 2 -o OUT

Each ``--variant`` is a label and the sampler attributes it sets (``plain`` sets none), e.g.
``thompson:thompson_share=0.3``. The report (bench.md, runs.jsonl) is `surrotune bench`'s, so
the numbers compare with docs/BENCHMARKS.md's; ``--resume`` keeps finished runs.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from surrotune.bench.harness import SamplerSpec, parse_options, run_bench


def parse_variant(text: str) -> SamplerSpec:
    """``label:name=value,name=value`` as a surrogate SamplerSpec with those attributes."""
    label, attrs = parse_options(text)
    return SamplerSpec("surrogate", label, (("attrs", attrs),) if attrs else ())


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
