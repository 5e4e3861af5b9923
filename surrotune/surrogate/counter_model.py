"""Counter predictors: configuration → Nsight Compute counters, as extra model features.

A time says *that* a configuration is slow; its counters say *why*: occupancy, the throughput of
the SMs and of each memory level, hit rates, shared-memory bank conflicts, registers, the stalls
the warps wait on. Counters are measured on a few trials only (profiling costs seconds per
configuration), and never on the candidates the sampler scores. So a small model per counter
learns configuration → counter on the trials that carry counters, and its *predictions* on every
configuration, measured or not, become extra columns of the performance model and the failure
classifier (:class:`~surrotune.surrogate.sampler.SurrogateSampler` with ``counter_features``).
The same function of the configuration feeds the training rows and the candidates, so a model
never learns from a column it cannot see at prediction time.

Where the counters come from (:func:`trial_counters`):

* a replayed recording: the trial's user attribute ``counters`` (a dict metric → float, from the
  recording's :attr:`~surrotune.result.Result.counters`);
* a live run: the study attribute ``counters.<trial number>`` that the counters stage
  (:mod:`surrotune.counters.stage`) writes after profiling, ``{"counters": {...}, ...}``.

The targets (:data:`COUNTER_TARGETS`) are the counters that describe the configuration rather
than one launch's noise, each on a scale a tree regressor handles: percentages as they are,
counts that span decades as ``log1p``, the bank conflicts as conflicts per shared access.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.trial import FrozenTrial

from surrotune.verdicts import profiled_trial_counters

__all__ = [
    "COUNTER_TARGETS",
    "DEFAULT_TARGETS",
    "MIN_PROFILED",
    "CounterModel",
    "counter_row",
    "trial_counters",
]

#: the fewest trials with counters before counter predictions become features
MIN_PROFILED = 10


def _ratio(counters: Mapping[str, float], num: str, den: str) -> float:
    a, b = counters.get(num), counters.get(den)
    if a is None or b is None or not b:
        return math.nan
    return float(a) / float(b)


def _log1p(name: str) -> Callable[[Mapping[str, float]], float]:
    def read(counters: Mapping[str, float]) -> float:
        v = counters.get(name)
        return math.log1p(max(float(v), 0.0)) if v is not None else math.nan

    return read


def _plain(name: str) -> Callable[[Mapping[str, float]], float]:
    def read(counters: Mapping[str, float]) -> float:
        v = counters.get(name)
        return float(v) if v is not None else math.nan

    return read


#: target name -> how it is read from a trial's counters (NaN where the trial lacks it)
COUNTER_TARGETS: dict[str, Callable[[Mapping[str, float]], float]] = {
    "achieved_occupancy": _plain("achieved_occupancy"),
    "sm_throughput": _plain("sm_throughput"),
    "dram_throughput": _plain("dram_throughput"),
    "memory_throughput": _plain("memory_throughput"),
    "l2_hit_rate": _plain("l2_hit_rate"),
    "bank_conflicts_per_request": lambda c: _ratio(c, "shared_bank_conflicts", "shared_requests"),
    "registers": _plain("registers"),
    "log_local_bytes": _log1p("local_bytes"),
    "stall_long_scoreboard": _plain("stall_long_scoreboard"),
    "stall_short_scoreboard": _plain("stall_short_scoreboard"),
    "stall_mio_throttle": _plain("stall_mio_throttle"),
    "stall_barrier": _plain("stall_barrier"),
}


#: the targets learned by default: the counters that describe *how* a configuration runs, not
#: *how fast*. The throughputs (SM, DRAM, memory, as % of peak over the elapsed time) are work
#: divided by the time, the objective under another name (on the H200 GEMM, DRAM throughput and
#: log time rank-correlate at -0.93): a predictor of them is a second performance model trained
#: on fewer rows, and measured to cost evaluations (docs/BENCHMARKS.md, issue 6).
DEFAULT_TARGETS: tuple[str, ...] = (
    "achieved_occupancy",
    "l2_hit_rate",
    "bank_conflicts_per_request",
    "registers",
    "log_local_bytes",
    "stall_long_scoreboard",
    "stall_short_scoreboard",
    "stall_mio_throttle",
    "stall_barrier",
)


def counter_row(counters: Mapping[str, Any] | None, targets: Sequence[str]) -> np.ndarray:
    """The targets of one trial's counters, NaN where missing or not a finite number."""
    out = np.full(len(targets), np.nan)
    if not counters:
        return out
    numeric = {
        k: float(v)
        for k, v in counters.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    for j, name in enumerate(targets):
        v = COUNTER_TARGETS[name](numeric)
        out[j] = v if math.isfinite(v) else np.nan
    return out


def trial_counters(
    trials: Iterable[FrozenTrial], study_attrs: Mapping[str, Any] | None = None
) -> dict[int, Mapping[str, Any]]:
    """Trial number -> its counters, from the trials' ``counters`` user attribute and the
    study's ``counters.<number>`` attributes (the study's win where both exist: they are the
    profile of this run)."""
    out: dict[int, Mapping[str, Any]] = {}
    for t in trials:
        counters = t.user_attrs.get("counters")
        if isinstance(counters, Mapping) and counters:
            out[t.number] = counters
    out.update(profiled_trial_counters(study_attrs or {}))
    return out


class CounterModel:
    """One small boosted regressor per counter target: configuration features → counter.

    Args:
        targets: names from :data:`COUNTER_TARGETS` (default :data:`DEFAULT_TARGETS`).
        n_estimators: boosting rounds per target.
        max_depth: tree depth.
        learning_rate: shrinkage.
        min_rows: a target is learned only from at least this many trials that carry it (and
            not all equal); the others are left out of :attr:`targets_`.
        seed: XGBoost seed; the model is deterministic for a seed.
        n_jobs: XGBoost threads.
    """

    def __init__(
        self,
        *,
        targets: Sequence[str] = DEFAULT_TARGETS,
        n_estimators: int = 60,
        max_depth: int = 4,
        learning_rate: float = 0.15,
        min_rows: int = MIN_PROFILED,
        seed: int = 0,
        n_jobs: int = 1,
    ) -> None:
        unknown = [t for t in targets if t not in COUNTER_TARGETS]
        if unknown:
            raise ValueError(
                f"unknown counter targets {unknown}; expected some of {', '.join(COUNTER_TARGETS)}"
            )
        self.targets = tuple(targets)
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_rows = min_rows
        self.seed = seed
        self.n_jobs = n_jobs

    def fit(self, X: np.ndarray, Y: np.ndarray) -> CounterModel:
        """Fit on features ``X`` ``(n, d)`` and targets ``Y`` ``(n, len(targets))``, NaN where a
        trial lacks a counter; returns self."""
        import xgboost as xgb

        X = np.asarray(X, dtype=np.float32)
        Y = np.asarray(Y, dtype=np.float64)
        if X.ndim != 2 or Y.shape != (len(X), len(self.targets)):
            raise ValueError(
                f"fit needs X (n, d) and Y (n, {len(self.targets)}); got {X.shape} and {Y.shape}"
            )
        self.n_features_in_ = X.shape[1]
        self.targets_: list[str] = []
        self.boosters_: list[Any] = []
        self.scale_: list[tuple[float, float]] = []
        params = {
            "objective": "reg:squarederror",
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": 0.9,
            "tree_method": "hist",
            "nthread": self.n_jobs,
            "base_score": 0.0,
            "verbosity": 0,
            "seed": self.seed,
        }
        for j, name in enumerate(self.targets):
            rows = np.isfinite(Y[:, j])
            y = Y[rows, j]
            if rows.sum() < self.min_rows or np.ptp(y) == 0:
                continue
            mean, scale = float(y.mean()), float(y.std()) or 1.0
            data = xgb.DMatrix(X[rows], label=(y - mean) / scale, nthread=self.n_jobs)
            booster = xgb.train(params, data, num_boost_round=self.n_estimators)
            self.targets_.append(name)
            self.boosters_.append(booster)
            self.scale_.append((mean, scale))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``(n, len(targets_))``: the predicted counters, on the targets' scales."""
        if not hasattr(self, "boosters_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("This CounterModel is not fitted yet; call fit(X, Y) first.")
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[-1]} features, but this model was fitted with "
                f"{self.n_features_in_}"
            )
        out = np.empty((len(X), len(self.boosters_)), dtype=np.float64)
        for j, (booster, (mean, scale)) in enumerate(
            zip(self.boosters_, self.scale_, strict=True)
        ):
            out[:, j] = booster.inplace_predict(X).astype(np.float64) * scale + mean
        return out

    def augment(self, X: np.ndarray) -> np.ndarray:
        """``X`` with the predicted counters appended as columns (float32)."""
        X = np.asarray(X, dtype=np.float32)
        if not self.boosters_:
            return X
        return np.ascontiguousarray(np.hstack([X, self.predict(X).astype(np.float32)]))
