"""Offline model quality: how good are the configurations the performance model ranks first,
fitted on n random configurations of a recording? No search loop, so no seed-to-seed luck of a
trajectory: a screen of model options (XGBoost's parameters, the GP correction) in seconds.

    python3 benchmarks/model_quality.py --datasets FILE... \
        --variant default --variant 'd3:max_depth=3' --variant 'nogp:gp=False' \
        --sizes 20,50,100 --reps 30

For each recording, variant and training size n, ``reps`` seeded random training sets of n
configurations (failures included; the regressor, as in the sampler, learns the ok ones on the
copula scale, with the sampler's features) are drawn; the model then ranks every configuration it
has not seen, and the table gives the mean over training sets of: the best fraction of the
optimum among its top 5 (``top5``; a failed configuration counts 0), the mean fraction among its
top 20 (``top20``) and the Spearman correlation of its predictions with the truth over the unseen
ok configurations (``rho``). ``gp=False`` leaves out the GP correction of the trees' mean
(``uncertainty="gp"``'s residual model); ``resources=True`` adds the sampler's
``resource_features`` columns (a ResourceModel fitted on the training set's trial attributes,
failures included; recordings that report no resources are left as they are); every other
option is a PerformanceModel argument.
"""

from __future__ import annotations

import argparse

import numpy as np
import optuna
from scipy.stats import spearmanr

from surrotune.backends.replay import ReplayBackend
from surrotune.bench.harness import (
    SamplerSpec,
    _make,
    parse_options,
    prepare_dataset,
    with_launch_shape,
)
from surrotune.runner import device_limits
from surrotune.surrogate.performance import CopulaScale, PerformanceModel, transform_objective
from surrotune.surrogate.residual import ResidualGP, out_of_bag_residuals
from surrotune.surrogate.resources import ResourceFeatures, ResourceModel


def recording_table(path: str) -> dict[str, np.ndarray | str]:
    """The recording's name, and the features, encodings, values and fractions of the optimum
    of every feasible recorded configuration, built the way the sampler builds its candidate
    table."""
    dataset, space, _, summary = prepare_dataset(path)
    device = device_limits(ReplayBackend(dataset).device())
    sampler = with_launch_shape(_make(SamplerSpec("surrogate", "s"), space, seed=0), dataset)
    table = sampler._table_for(space)
    rows = np.flatnonzero(table.allowed)
    results = [dataset.lookup(table.config(int(i))) for i in rows]
    keep = [j for j, r in enumerate(results) if r is not None and r.status.counts_as_evaluation]
    rows = rows[keep]
    values = np.array(
        [results[j].objective if results[j].ok else np.nan for j in keep], dtype=np.float64
    )
    optimum = summary.optimum
    fraction = optimum / values if dataset.direction == "minimize" else values / optimum
    attrs = []  # what the runner stores with each trial, as the sampler's resource model reads it
    for j in keep:
        result = results[j]
        assert result is not None
        attrs.append({**result.to_user_attrs(), "device_limits": device})
    return {
        "name": summary.name, "X": table.features[rows], "encoded": table.encoded[rows],
        "values": values, "fraction": np.nan_to_num(fraction, nan=0.0),
        "direction": dataset.direction, "attrs": attrs, "device": device,
    }  # fmt: skip


def score_once(table: dict, n: int, rep: int, options: dict) -> tuple[float, float, float] | None:
    """(top5, top20, rho) of one model fitted on one seeded random training set of ``n``."""
    options = dict(options)
    use_gp = bool(options.pop("gp", True))
    use_resources = bool(options.pop("resources", False))
    rng = np.random.default_rng(1000 * n + rep)
    total = len(table["values"])
    train = rng.choice(total, size=n, replace=False)
    ok = train[~np.isnan(table["values"][train])]
    if len(ok) < 3:
        return None
    X = table["X"]
    if use_resources:
        resources = ResourceModel(seed=rep).fit(
            X[train], [table["attrs"][i] for i in train], table["device"],
            ~np.isnan(table["values"][train]),
        )  # fmt: skip
        if resources.informative:
            X = ResourceFeatures(resources, table["device"]).augment(X)
    y = transform_objective(table["values"][ok], table["direction"])
    y = CopulaScale().fit(y).transform(y)
    model = PerformanceModel(seed=rep, **options).fit(X[ok], y)
    test = np.setdiff1d(np.arange(total), train)
    mean = model.predict_members(X[test]).mean(axis=0)
    if use_gp:
        members = model.predict_members(X[ok])
        rows, residuals = out_of_bag_residuals(members, model.out_of_bag(len(y)), y)
        if len(rows) >= 8:
            gp = ResidualGP(correct_mean=True, seed=rep).fit(table["encoded"][ok][rows], residuals)
            mean = mean + gp.predict(table["encoded"][test])[0]
    order = np.argsort(mean)
    fraction = table["fraction"][test]
    measured = ~np.isnan(table["values"][test])
    rho = spearmanr(mean[measured], -fraction[measured]).statistic
    return float(fraction[order[:5]].max()), float(fraction[order[:20]].mean()), float(rho)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--sizes", default="20,50,100")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    variants = [parse_options(text) for text in args.variant]
    sizes = [int(s) for s in args.sizes.split(",")]
    header = " | ".join(f"n={n}: top5, top20, rho" for n in sizes)
    print(f"| recording | variant | {header} |")
    print("|---|---|" + "---:|" * len(sizes))
    for path in args.datasets:
        table = recording_table(path)
        for label, options in variants:
            cells = []
            for n in sizes:
                scores = [score_once(table, n, rep, dict(options)) for rep in range(args.reps)]
                kept = np.array([s for s in scores if s is not None])
                cells.append(", ".join(f"{v:.3f}" for v in kept.mean(axis=0)))
            print(f"| {table['name']} | {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
