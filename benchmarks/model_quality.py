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
failures included; recordings that report no resources are left as they are); ``subsets=K``
adds the log2 product of every 3 to K of the positive parameters (pairs are already features);
``bore=γ`` ranks by an ensemble of XGBoost classifiers of the best γ share of the training
rows, failures counted as not best (BORE: Tiao et al., "Bayesian optimization by density-ratio
estimation", ICML 2021), and ``rank=True`` by boosters with a pairwise ranking objective (both
without the GP correction); every other option is a PerformanceModel argument (``forest``
among them).
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
        "raw": table.raw[rows], "pair_cols": list(table.pair_cols),
        "values": values, "fraction": np.nan_to_num(fraction, nan=0.0),
        "direction": dataset.direction, "attrs": attrs, "device": device,
    }  # fmt: skip


def subset_products(raw: np.ndarray, columns: list[int], largest: int) -> np.ndarray:
    """log2 of the product of every subset of 3 to ``largest`` of the positive columns."""
    from itertools import combinations

    logs = np.log2(raw[:, columns]) if columns else np.zeros((len(raw), 0))
    parts = [
        logs[:, list(subset)].sum(axis=1)
        for k in range(3, min(largest, len(columns)) + 1)
        for subset in combinations(range(len(columns)), k)
    ]
    return np.stack(parts, axis=1) if parts else np.zeros((len(raw), 0))


def other_model(
    X: np.ndarray, train: np.ndarray, ok: np.ndarray, y: np.ndarray, test: np.ndarray,
    rep: int, bore: float, rank: bool,
) -> np.ndarray:
    """Scores (lower is better) of the unseen rows from a classifier of the best ``bore``
    share of the training rows (failures count as not best: BORE, Tiao et al. 2021) or from a
    pairwise-ranking booster."""
    import xgboost as xgb

    params = {"max_depth": 5, "eta": 0.1, "subsample": 0.9, "colsample_bytree": 0.8,
              "tree_method": "hist", "nthread": 1, "verbosity": 0}  # the sampler's boosters'
    assert bore or rank
    if bore:  # 1 for the training rows among the best ``bore`` share, failures included as 0
        label = np.isin(train, ok[y <= np.quantile(y, bore)]).astype(np.float64)
    scores = []
    for k in range(5):
        r = np.random.default_rng(rep * 10 + k)
        if bore:
            rows = r.integers(0, len(train), size=len(train))
            d = xgb.DMatrix(X[train][rows], label=label[rows])
            b = xgb.train({**params, "objective": "binary:logistic", "seed": k}, d, 120)
            scores.append(-b.inplace_predict(X[test]))
        else:
            rows = r.integers(0, len(ok), size=len(ok))
            d = xgb.DMatrix(X[ok][rows], label=-y[rows])
            d.set_group([len(rows)])
            b = xgb.train({**params, "objective": "rank:pairwise", "seed": k}, d, 120)
            scores.append(-b.inplace_predict(X[test]))
    return np.mean(scores, axis=0)


def copula_target(table: dict, ok: np.ndarray) -> np.ndarray:
    """The ``ok`` rows' objective as the sampler's regressor learns it: transformed (log of
    times), then on the copula scale."""
    y = transform_objective(table["values"][ok], table["direction"])
    return CopulaScale().fit(y).transform(y)


def model_mean(
    table: dict, X: np.ndarray, ok: np.ndarray, y: np.ndarray, test: np.ndarray, rep: int,
    options: dict, *, gp: bool = True,
) -> np.ndarray:
    """The sampler's performance model's mean on the ``test`` rows of ``X``, fitted on the
    ``ok`` rows (targets ``y``): the ensemble with ``options``, plus (``gp``) the GP correction
    of its out-of-bag errors, as ``uncertainty="gp"`` adds it once eight rows have one."""
    model = PerformanceModel(seed=rep, **options).fit(X[ok], y)
    mean = model.predict_members(X[test]).mean(axis=0)
    if gp:
        members = model.predict_members(X[ok])
        rows, residuals = out_of_bag_residuals(members, model.out_of_bag(len(y)), y)
        if len(rows) >= 8:
            gp_model = ResidualGP(correct_mean=True, seed=rep)
            gp_model.fit(table["encoded"][ok][rows], residuals)
            mean = mean + gp_model.predict(table["encoded"][test])[0]
    return mean


def score_once(table: dict, n: int, rep: int, options: dict) -> tuple[float, float, float] | None:
    """(top5, top20, rho) of one model fitted on one seeded random training set of ``n``."""
    options = dict(options)
    use_gp = bool(options.pop("gp", True))
    use_resources = bool(options.pop("resources", False))
    subsets = int(options.pop("subsets", 0))
    bore = float(options.pop("bore", 0.0))
    rank = bool(options.pop("rank", False))
    rng = np.random.default_rng(1000 * n + rep)
    total = len(table["values"])
    train = rng.choice(total, size=n, replace=False)
    ok = train[~np.isnan(table["values"][train])]
    if len(ok) < 3:
        return None
    X = table["X"]
    if subsets >= 3:
        X = np.concatenate([X, subset_products(table["raw"], table["pair_cols"], subsets)], axis=1)
    if use_resources:
        resources = ResourceModel(seed=rep).fit(
            X[train], [table["attrs"][i] for i in train], table["device"],
            ~np.isnan(table["values"][train]),
        )  # fmt: skip
        if resources.informative:
            X = ResourceFeatures(resources, table["device"]).augment(X)
    y = copula_target(table, ok)
    test = np.setdiff1d(np.arange(total), train)
    if bore or rank:
        mean = other_model(X, train, ok, y, test, rep, bore, rank)
    else:
        mean = model_mean(table, X, ok, y, test, rep, options, gp=use_gp)
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
