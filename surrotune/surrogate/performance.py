"""The performance model: XGBoost on a transformed objective, with an ensemble's uncertainty.

Kernel times span orders of magnitude and matter relatively (10 % faster is 10 % faster at any
scale), so the model learns ``log(time)``; a maximised rate (GFLOP/s) is learned as
``-log(rate)``, so that the model always *minimises* and one acquisition serves both directions.

The uncertainty that expected improvement needs comes from an ensemble: K boosted models, each on
a bootstrap resample of the observations with its own seed, give a mean and a spread. Quantile
regression or a GP would also do; the ensemble is cheap (K small models, vectorised
``inplace_predict``), indifferent to the shape of the response, and its spread grows where the
data is thin or contradictory, which is where exploring pays.

Follows the scikit-learn contract: ``__init__`` stores parameters only, ``fit`` returns self,
learned attributes end in ``_``, and predicting before fitting raises ``NotFittedError``.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
from sklearn.exceptions import NotFittedError

__all__ = ["PerformanceModel", "transform_objective"]


def transform_objective(values: np.ndarray, direction: str) -> np.ndarray:
    """Objective values to the model's scale, where lower is always better.

    ``minimize``: ``log(v)`` when every value is positive (times), else ``v``.
    ``maximize``: ``-log(v)`` when every value is positive (rates), else ``-v``.
    """
    v = np.asarray(values, dtype=np.float64)
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize'; got {direction!r}")
    y = np.log(v) if len(v) and (v > 0).all() else v.copy()
    return y if direction == "minimize" else -y


class PerformanceModel:
    """An ensemble of XGBoost regressors on bootstrap resamples: predicts mean and spread.

    Args:
        n_models: ensemble size K (K = 1 gives no spread: std 0).
        n_estimators: boosting rounds per model.
        max_depth: tree depth.
        learning_rate: shrinkage.
        subsample: row subsampling inside each model (on top of the bootstrap).
        colsample_bytree: column subsampling per tree; decorrelates the members further.
        min_child_weight: the smallest hessian sum in a leaf (1 = one observation).
        bootstrap: resample rows with replacement per member; without it only the seeds differ.
        seed: seeds member ``k`` with ``seed + k``; the model is deterministic for a seed.
        n_jobs: XGBoost threads per model.
    """

    def __init__(
        self,
        *,
        n_models: int = 5,
        n_estimators: int = 120,
        max_depth: int = 5,
        learning_rate: float = 0.1,
        subsample: float = 0.9,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 1.0,
        bootstrap: bool = True,
        seed: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_models = n_models
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.bootstrap = bootstrap
        self.seed = seed
        self.n_jobs = n_jobs

    def fit(self, X: np.ndarray, y: np.ndarray) -> PerformanceModel:
        """Fit K members on bootstrap resamples of ``(X, y)``; returns self."""
        import xgboost as xgb

        if self.n_models < 1:
            raise ValueError(f"n_models must be at least 1; got {self.n_models}")
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or len(X) != len(y) or len(y) == 0:
            raise ValueError(
                f"fit needs a 2-D X with one row per target; got X {X.shape} and y {y.shape}"
            )
        self.n_features_in_ = X.shape[1]
        self.y_mean_ = float(y.mean())
        self.y_scale_ = float(y.std()) or 1.0
        target = (y - self.y_mean_) / self.y_scale_
        params: dict[str, Any] = {
            "objective": "reg:squarederror",
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "tree_method": "hist",
            "nthread": self.n_jobs,
            "base_score": 0.0,
            "verbosity": 0,
        }
        self.boosters_ = []
        for k in range(self.n_models):
            rng = np.random.default_rng(self.seed + k)
            rows = (
                rng.integers(0, len(y), size=len(y))
                if self.bootstrap and self.n_models > 1
                else np.arange(len(y))
            )
            data = xgb.DMatrix(X[rows], label=target[rows], nthread=self.n_jobs)
            booster = xgb.train(
                {**params, "seed": self.seed + k}, data, num_boost_round=self.n_estimators
            )
            self.boosters_.append(booster)
        return self

    @overload
    def predict(self, X: np.ndarray, *, return_std: Literal[False] = ...) -> np.ndarray: ...

    @overload
    def predict(
        self, X: np.ndarray, *, return_std: Literal[True]
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def predict(
        self,
        X: np.ndarray,
        *,
        return_std: bool = False,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The ensemble mean (and, with ``return_std``, its spread) on the target's scale."""
        if not hasattr(self, "boosters_"):
            raise NotFittedError(
                "This PerformanceModel instance is not fitted yet; call fit(X, y) first."
            )
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[-1]} features, but this model was fitted with "
                f"{self.n_features_in_}"
            )
        preds = np.stack([b.inplace_predict(X) for b in self.boosters_]).astype(np.float64)
        preds = preds * self.y_scale_ + self.y_mean_
        mean = preds.mean(axis=0)
        if not return_std:
            return mean
        return mean, preds.std(axis=0)
