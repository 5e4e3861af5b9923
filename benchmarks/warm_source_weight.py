"""The ranking weight a warm start's source keeps once its design has been measured.

    python3 benchmarks/warm_source_weight.py TARGET BUNDLE... [--after 10]

For each bundle (e.g. the five of ``warm_design_variants.py --source-runs 5``, in
``OUT/models/``), runs the default warm start on TARGET's recording (replay, seed k for the k-th
bundle) for ``--after`` evaluations plus one, and prints the weight the ranking-weighted fit
gives the source against the target's own model at the next suggestion
(:func:`surrotune.surrogate.transfer.ranking_weights`). A source that misleads (its best regions
are not the target's) would be worth detecting here, before the search follows it; this shows
whether the weight does (docs/BENCHMARKS.md, "Five source runs per pair").
"""

from __future__ import annotations

import argparse

import optuna

from surrotune.backends.replay import ReplayBackend
from surrotune.bench.harness import _make, prepare_dataset, with_launch_shape
from surrotune.bench.transfer import method_spec
from surrotune.runner import Runner


def source_weight(target: str, bundle: str, seed: int, after: int) -> float | None:
    """The source's ranking weight at the suggestion after ``after`` measurements."""
    dataset, space, _, _ = prepare_dataset(target)
    sampler = _make(method_spec("warm", "warm", bundle), space, seed=seed)
    study = optuna.create_study(
        sampler=with_launch_shape(sampler, dataset), direction=dataset.direction
    )
    backend = ReplayBackend(dataset)
    Runner(
        study=study, space=space, backend=backend, trials=after + 1, timeout_s=600, batch_size=1
    ).run()
    fit = sampler.last_transfer
    weights = [w for label, w in (fit.weights if fit else {}).items() if label != "target"]
    return weights[0] if weights else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--after", type=int, default=10)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| bundle | seed | source weight |\n|---|---:|---:|")
    for seed, bundle in enumerate(args.bundles):
        weight = source_weight(args.target, bundle, seed, args.after)
        print(f"| {bundle} | {seed} | {'-' if weight is None else f'{weight:.2f}'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
