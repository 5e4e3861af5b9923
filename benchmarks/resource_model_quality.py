"""Offline quality of the resource model on the rows the sampler itself gathered.

    python3 benchmarks/resource_model_quality.py --datasets FILE... \
        --variant default --variant 'trees:hybrid=False' --evaluations 20,40,80 --seeds 4

Why on the sampler's rows, not random ones: the resource model's weak spot is extrapolation to
regions the search has not measured, and a search's rows cluster where a random draw's do not.
For each recording, seed and number of evaluations n, the default SurrogateSampler runs n
evaluations through the replay loop; the rows its resource model was last fitted on (features,
trial attributes, device limits) are kept, and each ``--variant`` (a label and ResourceModel
options, ``default`` none) is fitted on them and scores every candidate of the search space
against the recording:

- ``auc``: ROC AUC of P(fits) between the ok configurations and the resource failures;
- ``leak``: the share of resource failures with P(fits) ≥ 0.5 (let through);
- ``top``: the mean P(fits) of the best 2 % of the ok configurations (the optimum's group, at
  least 3);
- ``gated``: the share of ok configurations with P(fits) < 0.1 (ruled out, wrongly).

Recordings whose trials report no resources (Kernel Tuner's) give no rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from sklearn.metrics import roc_auc_score

from surrotune.backends.replay import ReplayBackend
from surrotune.bench.harness import dataset_name, parse_options, prepare_dataset, with_launch_shape
from surrotune.runner import Runner
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.resources import ResourceModel


def watch_resources(
    sampler: SurrogateSampler, dataset: Any, space: Any, evaluations: int
) -> dict[str, Any]:
    """Run ``evaluations`` of the replay loop with ``sampler``, keeping the arguments of the
    last fit of its resource model (``study``, ``obs``, ``X``, ``ok``; empty: never fitted)."""
    seen: dict[str, Any] = {}
    learn = sampler._resources

    def keep(study: Any, obs: Any, X: np.ndarray, ok: np.ndarray) -> Any:
        seen.update(study=study, obs=obs, X=np.array(X), ok=np.array(ok))
        return learn(study, obs, X, ok)

    sampler._resources = keep  # type: ignore[method-assign]
    study = optuna.create_study(
        sampler=with_launch_shape(sampler, dataset), direction=dataset.direction
    )
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=evaluations).run()
    sampler._resources = learn  # type: ignore[method-assign]
    return seen


def recorded_outcomes(dataset: Any, table: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The recorded status of the first ``n`` candidates of ``table``, and their objective
    (lower is better; inf where not ok)."""
    results = [dataset.lookup(table.config(i)) for i in range(n)]
    status = np.array([r.status.value if r is not None else "" for r in results])
    sign = 1.0 if dataset.direction == "minimize" else -1.0
    value = np.array([sign * r.objective if r is not None and r.ok else np.inf for r in results])
    return status, value


def sampler_rows(path: str, seed: int, evaluations: int) -> dict[str, Any] | None:
    """The rows the sampler's resource model saw after ``evaluations``, and the candidates'
    features and recorded outcomes; None where it learned no resources."""
    dataset, space, _, _ = prepare_dataset(path)
    sampler = SurrogateSampler(space=space, seed=seed)
    seen = watch_resources(sampler, dataset, space, evaluations)
    table = sampler._table
    if not seen or sampler._fit is None or table is None:
        return None
    attrs, device = sampler._resource_attrs(seen["study"], seen["obs"])
    candidates = sampler._fit.augment(table.features)
    status, value = recorded_outcomes(dataset, table, len(candidates))
    return {"X": seen["X"], "attrs": attrs, "device": device, "ok": seen["ok"],
            "candidates": candidates, "status": status, "value": value}  # fmt: skip


def scores(p: np.ndarray, status: np.ndarray, value: np.ndarray) -> dict[str, float]:
    ok, failed = status == "ok", status == "resource"
    labelled = ok | failed
    top = np.argsort(value)[: max(3, int(0.02 * ok.sum()))]
    both = ok.any() and failed.any()
    return {
        "auc": float(roc_auc_score(ok[labelled], p[labelled])) if both else np.nan,
        "leak": float((p[failed] >= 0.5).mean()) if failed.any() else np.nan,
        "top": float(p[top].mean()),
        "gated": float((p[ok] < 0.1).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--evaluations", default="20,40,80")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    variants = [parse_options(v) for v in args.variant]
    rows = []
    for path in args.datasets:
        for n in map(int, args.evaluations.split(",")):
            for seed in range(args.seeds):
                seen = sampler_rows(path, seed, n)
                if seen is None:
                    continue
                for label, options in variants:
                    model = ResourceModel(seed=seed, **dict(options))
                    model.fit(seen["X"], seen["attrs"], seen["device"], seen["ok"])
                    p = model.predict_fits(seen["candidates"])
                    measured = scores(p, seen["status"], seen["value"])
                    rows.append({"dataset": dataset_name(Path(path)), "n": n, "variant": label,
                                 **measured})  # fmt: skip
    if not rows:
        raise SystemExit("no recording reports resources: nothing to score")
    frame = pd.DataFrame(rows)
    metrics = ["auc", "leak", "top", "gated"]
    per = frame.groupby(["dataset", "n", "variant"])[metrics].mean().round(3)
    print(per.unstack("variant").to_string())
    print()
    print(frame.groupby(["n", "variant"])[metrics].mean().round(3).to_string())


if __name__ == "__main__":
    main()
