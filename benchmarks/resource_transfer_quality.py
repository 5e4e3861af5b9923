"""Offline quality of the warm start's P(fits) on the target, from the rows a warm search gathered.

    python3 benchmarks/resource_transfer_quality.py TARGET BUNDLE [BUNDLE ...] \
        --evaluations 15,30,60,120 --seeds 4

For each seed s and number of evaluations n, a warm-started SurrogateSampler (from BUNDLE
number s mod the count; the sources' resource classifiers deciding, ``transfer_resources``
off, so that every variant below is scored on the same rows) runs n evaluations of the TARGET
recording through the replay loop. On the rows its models were last fitted on, each way of
judging the resource limits then scores every candidate against the recording:

- ``own``: the target's own ResourceModel alone (what a cold start has);
- ``own*clf``: it times the sources' failure classifiers' factor (compile and resource kinds,
  with their transfer beliefs): the warm start before the resource model was in the bundle;
- ``prior``: the sources' resource models against the target's limits, shifted by the
  target's rows (:func:`~surrotune.surrogate.transfer.resource_transfer` without ``own``);
- ``transfer``: the same with the target's own model, whichever errs less (the default);
- ``own*prior``: both as two gates;
- ``transfer*clf``: the transfer times the sources' classifiers' factor (kept, not replaced).

Metrics as in ``resource_model_quality.py``: ``auc`` of P(fits) between the ok
configurations and the resource failures, ``leak`` (failures at P ≥ 0.5), ``top`` (mean P of
the best 2 % of the ok ones), ``gated`` (ok ones at P < 0.1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd

from surrotune.bench.harness import prepare_dataset
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.transfer import WarmStart, resource_transfer

sys.path.insert(0, str(Path(__file__).parent))
from resource_model_quality import recorded_outcomes, scores, watch_resources


def judged(target: str, bundle: str, seed: int, evaluations: int) -> dict[str, Any] | None:
    """Each variant's P(fits) over the candidates after ``evaluations`` warm evaluations, and
    the recorded status and value of every candidate; None where nothing was learned."""
    dataset, space, _, _ = prepare_dataset(target)
    warm = WarmStart(bundle, transfer_resources=False)
    sampler = SurrogateSampler(space=space, seed=seed, warm_start=warm)
    seen = watch_resources(sampler, dataset, space, evaluations)
    table = sampler._table
    if not seen or table is None:
        return None
    status, value = recorded_outcomes(dataset, table, len(table.features))
    obs = seen["obs"]
    own = sampler._resources(seen["study"], obs, seen["X"], seen["ok"])
    attrs, _ = sampler._resource_attrs(seen["study"], obs)
    candidates = sampler._sources(table)
    observed = sampler._observed_sources(table, obs.keys)
    ok = [v is not None for v in obs.values]
    device = sampler._target_device
    both = resource_transfer(candidates, observed, attrs, ok, device, own, table.features)
    prior = resource_transfer(candidates, observed, attrs, ok, device)
    if both is None or prior is None:
        return None
    own_p = own.predict_fits(table.features) if own is not None else np.ones(len(status))
    classifiers = sampler._warm.failure_factor(observed, candidates, obs.statuses, device)
    variants = {
        "own": own_p,
        "own*clf": own_p * classifiers,
        "prior": prior.fits,
        "transfer": both.fits,
        "own*prior": own_p * prior.fits,
        "transfer*clf": both.fits * classifiers,
    }
    return {"variants": variants, "status": status, "value": value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--evaluations", default="15,30,60,120")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = []
    for seed in range(args.seeds):
        for n in map(int, args.evaluations.split(",")):
            found = judged(args.target, args.bundles[seed % len(args.bundles)], seed, n)
            if found is None:
                continue
            for label, p in found["variants"].items():
                measured = scores(p, found["status"], found["value"])
                rows.append({"seed": seed, "n": n, "variant": label, **measured})
    if not rows:
        raise SystemExit("no source bundle has a resource model that applies to this target")
    frame = pd.DataFrame(rows)
    metrics = ["auc", "leak", "top", "gated"]
    table = frame.groupby(["n", "variant"])[metrics].mean().round(3)
    print(table.unstack("variant").to_string())


if __name__ == "__main__":
    main()
