"""How well the failure classifier's P(ok) predicts failures, per calibration option.

    python3 benchmarks/feasibility_calibration.py --datasets FILE... [--sizes 30,60,120] \
        [--draws 5] [--variant NAME:OPTION=VALUE,...]

For each recording, draws ``n`` measured configurations at random (``--draws`` times per size),
fits :class:`~surrotune.surrogate.feasibility.FeasibilityModel` on the sampler's own features of
them, and scores P(ok) on every other measured configuration of the recording: log loss and
Brier score (proper scores: lower is better), the expected calibration error (ECE: over ten
equal-width bins of P(ok), the gap between the mean P(ok) and the observed ok rate, weighted by
the bin's share; 0 means the probabilities mean what they say), and at the
sampler's gate (``gate_threshold``, 0.1) the share of failures let through ("leak") and of ok
configurations held back ("lost"). A table per dataset, one row per (size, variant).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn import metrics

from surrotune.bench.harness import parse_options, prepare_dataset
from surrotune.surrogate.feasibility import FeasibilityModel
from surrotune.surrogate.sampler import SurrogateSampler

DEFAULT_VARIANTS = (
    "sigmoid:calibration='sigmoid'",
    "none:calibration='none'",
    "none-mcw0.1:calibration='none',min_child_weight=0.1",
)


def measured(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The sampler's features of every measured configuration inside the known constraints,
    and whether each ran ok."""
    dataset, space, _, _ = prepare_dataset(path)
    sampler = SurrogateSampler(space=space, seed=0)
    table = sampler._table_for(space)
    ok_of = {
        tuple(r.config[name] for name in space.names): r.ok
        for r in dataset.results.values()
        if r.status.counts_as_evaluation
    }
    configs = table.frame[list(space.names)].itertuples(index=False, name=None)
    rows, ok = [], []
    for row, config in enumerate(configs):
        if config in ok_of:
            rows.append(row)
            ok.append(ok_of[config])
    return table.features[np.array(rows)], np.array(ok)


def calibration_error(p_ok: np.ndarray, ok: np.ndarray, bins: int = 10) -> float:
    """ECE over ``bins`` equal-width bins of P(ok)."""
    which = np.minimum((p_ok * bins).astype(int), bins - 1)
    mean_p = np.bincount(which, weights=p_ok, minlength=bins)
    mean_ok = np.bincount(which, weights=ok.astype(float), minlength=bins)
    return float(np.abs(mean_p - mean_ok).sum() / len(p_ok))


def scores(p_ok: np.ndarray, ok: np.ndarray, gate: float) -> tuple[float, ...]:
    log_loss = float(metrics.log_loss(ok, p_ok, labels=[False, True]))
    brier = float(metrics.brier_score_loss(ok, p_ok))
    ece = calibration_error(p_ok, ok)
    leak = float((p_ok[~ok] >= gate).mean()) if (~ok).any() else float("nan")
    lost = float((p_ok[ok] < gate).mean())
    return log_loss, brier, ece, leak, lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--sizes", default="30,60,120")
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--gate", type=float, default=0.1)
    parser.add_argument("--variant", action="append")
    args = parser.parse_args(argv)
    variants = [parse_options(v) for v in (args.variant or DEFAULT_VARIANTS)]
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# {' '.join(['python3', *sys.argv])}")
    for path in args.datasets:
        X, ok = measured(path)
        print(f"\n{Path(path).name}: {len(ok)} measured, {1 - ok.mean():.1%} failed\n")
        print("| n | variant | log loss | Brier | ECE | leak at gate | lost at gate |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for n in sizes:
            for label, params in variants:
                rows = []
                for draw in range(args.draws):
                    rng = np.random.default_rng(draw)
                    train = rng.choice(len(ok), n, replace=False)
                    test = np.setdiff1d(np.arange(len(ok)), train)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        model = FeasibilityModel(seed=0, **dict(params)).fit(X[train], ok[train])
                    rows.append(scores(model.predict_ok(X[test]), ok[test], args.gate))
                ll, brier, ece, leak, lost = np.nanmean(np.array(rows), axis=0)
                print(
                    f"| {n} | {label} | {ll:.3f} | {brier:.3f} | {ece:.3f} | {leak:.2f} "
                    f"| {lost:.3f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
