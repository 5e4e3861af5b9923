"""Compare warm-start design options on a source -> target pair, in `surrotune bench`'s loop.

    python3 benchmarks/warm_design_variants.py SOURCE TARGET --variant NAME:OPTION=VALUE[,...] \
        [--variant ...] [--baselines] [--source-runs N] [--with-source SOURCE2 ...] \
        --seeds 20 --budget 200 --jobs 2 -o OUT

The source models are the ones `surrotune bench --warm-start` fits (200-evaluation surrogate runs
on SOURCE, seeds 0 .. N-1, one by default; kept in OUT/models/ and reused); the target's seed s
starts from the bundle of source run s mod N, as `surrotune bench --warm-start --source-runs N`
does. Each ``--variant`` is a label and the
:class:`~surrotune.surrogate.transfer.WarmStart` options it sets (``warm`` with none is the
default warm start), e.g. ``fill5:n_design=5,n_fill=5`` or ``adapt:adaptive=True``, or the
sampler's own attributes as ``sampler.NAME`` (``warmlog:sampler.objective_scale='log'``);
``--baselines`` adds the cold start and the enqueue baseline (the source's 10 best measured
configurations, then the surrogate), as `surrotune bench --warm-start --methods cold,enqueue`
runs them. ``--with-source`` (repeatable) adds another source GPU: its bundles are fitted the
same way, and two more columns run, ``warm@NAME`` (the default warm start from that source alone)
and ``warm@all`` (from every source at once, each seed from each source's run s mod N: the
several-sources warm start, whose ranking weights should follow the better source);
``--combined-variant`` adds a variant (as ``--variant``) of that one. ``--cold-variant`` and
``--enqueue-variant`` add a cold start or an enqueue baseline whose sampler attributes differ
(``coldmes:sampler.acquisition='mes'``), so that a sampler option is judged with and without
the warm start in one call. The report
(bench.md, runs.jsonl) is `surrotune bench`'s; with several source runs, by-source-run.md (also
printed) gives each column's evaluations to 98 % per source run; ``--resume`` keeps finished runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from surrotune.bench.harness import SamplerSpec, parse_options, run_bench
from surrotune.bench.transfer import by_source_run, fit_source_bundles, method_spec


def parse_variant(text: str, bundle: str, method: str = "warm") -> SamplerSpec:
    """``label:name=value,...`` as a warm-started surrogate with those WarmStart options; a
    name ``sampler.NAME`` sets the SurrogateSampler's attribute instead (e.g.
    ``sampler.objective_scale='log'``). With ``method`` ``cold`` or ``enqueue``, that baseline
    with those attributes: only sampler attributes apply to a baseline."""
    label, params = parse_options(text)
    warm = tuple((k, v) for k, v in params if not k.startswith("sampler."))
    attrs = tuple((k.removeprefix("sampler."), v) for k, v in params if k.startswith("sampler."))
    if warm and method != "warm":
        raise SystemExit(
            f"--{method}-variant {text!r}: only sampler.NAME options apply, not "
            f"{[k for k, _ in warm]}"
        )
    spec = method_spec(method, label, bundle)
    extra = (("warm_params", warm),) if warm else ()
    extra += (("attrs", attrs),) if attrs else ()
    return dataclasses.replace(spec, options=(*spec.options, *extra)) if extra else spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--baselines", action="store_true")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--source-runs", type=int, default=1)
    parser.add_argument("--with-source", action="append", default=[], metavar="SOURCE")
    parser.add_argument("--combined-variant", action="append", default=[], metavar="VARIANT")
    parser.add_argument("--cold-variant", action="append", default=[], metavar="VARIANT")
    parser.add_argument("--enqueue-variant", action="append", default=[], metavar="VARIANT")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    sources = [args.source, *args.with_source]
    fitted = fit_source_bundles(
        sources, out, 200, resume=True, runs=args.source_runs, jobs=args.jobs
    )

    def specs_for(run: int) -> list[SamplerSpec]:
        bundle = str(fitted[args.source][run])
        specs = [parse_variant(v, bundle) for v in args.variant]
        if args.baselines:
            specs += [method_spec("cold", "cold", bundle),
                      method_spec("enqueue", "enqueue", bundle)]  # fmt: skip
        specs += [parse_variant(v, bundle, "cold") for v in args.cold_variant]
        specs += [parse_variant(v, bundle, "enqueue") for v in args.enqueue_variant]
        if args.with_source:
            every = tuple(str(fitted[source][run]) for source in sources)
            for source, path in zip(sources[1:], every[1:], strict=True):
                specs.append(method_spec("warm", f"warm@{Path(source).name.split('.')[0]}", path))
            combined = [method_spec("warm", "warm@all", every[0])]
            combined += [parse_variant(v, every[0]) for v in args.combined_variant]
            specs += [dataclasses.replace(spec, options=(("warm_start", every), *spec.options[1:]))
                      for spec in combined]  # fmt: skip
        return specs

    by_run = [{s.label: s for s in specs_for(run)} for run in range(args.source_runs)]
    result = run_bench(
        [args.target], list(by_run[0].values()), args.budget, args.seeds, out, jobs=args.jobs,
        plots=False, resume=args.resume, command=shlex.join(["python3", *sys.argv]),
        seed_spec=lambda spec, seed: by_run[seed % len(by_run)][spec.label],
    )  # fmt: skip
    if args.source_runs > 1:  # which source run each column's count comes from
        (target,) = result.datasets
        rows = [((label,), label, target) for label in by_run[0]]
        text = "\n".join(by_source_run(rows, result.records, ("variant",), args.budget,
                                        args.source_runs))  # fmt: skip
        (out / "by-source-run.md").write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
