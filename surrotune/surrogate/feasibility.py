"""The feasibility model: P(ok) of a configuration, learned from the statuses of failed trials.

Known constraints are exact and handled by the SearchSpace; what is left are the failures nobody
wrote down (too many registers, too much shared memory, a compiler bug). They cluster in regions
of the space that a tree classifier finds quickly (``bx * by * tile > limit``), so a boosted
classifier on the same features as the performance model learns them from a few dozen trials.

Probabilities multiply expected improvement and gate candidates, so they must mean what they
say. The booster's own probabilities already fit the logistic loss; with few failures of one
kind they are shrunk towards the observed rate, and with a single class seen the model is a
constant (a Laplace-smoothed rate), since nothing distinguishes one candidate from another.
Platt scaling (``calibration="sigmoid"``, cross-validated by ``CalibratedClassifierCV``) is an
option, not the default: each of its three folds' boosters sees two thirds of a few dozen
observations and its sigmoid the last third, and P(ok) comes out flattened towards the base
rate. On the six H200 recordings and three of Kernel Tuner's, fitted on 30 to 200 random
measurements, it scored worse in log loss, Brier score and expected calibration error wherever
it applied and never better (benchmarks/feasibility_calibration.py: gemm at 120 rows, ECE 0.088
against 0.034), and let two to three times the failures through the gate. In the tuning loop it
kept P(ok) near 0.2 for a configuration that had failed twelve times out of twelve, and cost
failed evaluations on every H200 recording (docs/BENCHMARKS.md, "The failure classifier's
calibration").

Binary (ok against any failure): the acquisition only needs P(ok). The statuses themselves are
kept in ``status_counts_`` for reports.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence

import numpy as np
from sklearn.exceptions import NotFittedError

__all__ = ["FeasibilityModel"]


class FeasibilityModel:
    """P(ok) from a boosted classifier, shrunk towards the base rate where failures are few.

    Args:
        n_estimators: boosting rounds.
        max_depth: tree depth.
        learning_rate: shrinkage.
        min_child_weight: the smallest hessian sum in a leaf; lower lets the trees isolate a
            region that a few failures mark (a leaf of probability p needs about
            ``min_child_weight / (p (1 - p))`` observations).
        calibration: ``"none"``: the booster's own probabilities (its logistic loss already
            fits probabilities); ``"sigmoid"``: 3-fold Platt scaling
            (``CalibratedClassifierCV``) once both classes have ``calibrate_min`` observations,
            measured to be worse (module docstring).
        calibrate_min: below this many observations of either class, the raw probabilities
            are shrunk towards the base rate (and Platt scaling is not attempted).
        seed: XGBoost seed; the model is deterministic for a seed.
        n_jobs: XGBoost threads.
    """

    def __init__(
        self,
        *,
        n_estimators: int = 80,
        max_depth: int = 4,
        learning_rate: float = 0.15,
        min_child_weight: float = 1.0,
        calibration: str = "none",
        calibrate_min: int = 8,
        seed: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_child_weight = min_child_weight
        if calibration not in ("sigmoid", "none"):
            raise ValueError(f"calibration must be 'sigmoid' or 'none'; got {calibration!r}")
        self.calibration = calibration
        self.calibrate_min = calibrate_min
        self.seed = seed
        self.n_jobs = n_jobs

    def fit(
        self,
        X: np.ndarray,
        ok: np.ndarray,
        statuses: Sequence[str] | None = None,
    ) -> FeasibilityModel:
        """Fit on features ``X`` and outcomes ``ok`` (True = ran fine); returns self."""
        X = np.asarray(X, dtype=np.float32)
        ok = np.asarray(ok, dtype=bool)
        if X.ndim != 2 or len(X) != len(ok) or len(ok) == 0:
            raise ValueError(
                f"fit needs a 2-D X with one row per outcome; got X {X.shape} and ok {ok.shape}"
            )
        self.n_features_in_ = X.shape[1]
        self.status_counts_ = Counter(statuses if statuses is not None else [])
        n_ok = int(ok.sum())
        n_fail = len(ok) - n_ok
        self.prior_ = (n_ok + 1.0) / (len(ok) + 2.0)
        self.calibrated_ = False
        self.shrink_ = 1.0
        if n_ok == 0 or n_fail == 0:
            self.estimator_ = None
            return self
        from xgboost import XGBClassifier

        base = XGBClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            min_child_weight=self.min_child_weight,
            tree_method="hist",
            n_jobs=self.n_jobs,
            random_state=self.seed,
            verbosity=0,
        )
        y = (~ok).astype(np.int64)  # class 1 = failure: the rare class is the positive one
        if min(n_ok, n_fail) >= self.calibrate_min and self.calibration == "sigmoid":
            from sklearn.calibration import CalibratedClassifierCV
            from sklearn.model_selection import StratifiedKFold

            cv = StratifiedKFold(n_splits=3, shuffle=True, random_state=self.seed)
            self.estimator_ = CalibratedClassifierCV(base, method="sigmoid", cv=cv)
            self.calibrated_ = True
        else:
            self.estimator_ = base
            # few examples of one class: trust the classifier in proportion to them
            self.shrink_ = min(1.0, min(n_ok, n_fail) / float(self.calibrate_min))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.estimator_.fit(X, y)
        return self

    def predict_ok(self, X: np.ndarray) -> np.ndarray:
        """P(ok) per row of ``X``."""
        if not hasattr(self, "prior_"):
            raise NotFittedError(
                "This FeasibilityModel instance is not fitted yet; call fit(X, ok) first."
            )
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[-1]} features, but this model was fitted with "
                f"{self.n_features_in_}"
            )
        if self.estimator_ is None:
            return np.full(len(X), self.prior_)
        p_ok = self.estimator_.predict_proba(X)[:, 0].astype(np.float64)
        return self.shrink_ * p_ok + (1.0 - self.shrink_) * self.prior_

    @property
    def informative(self) -> bool:
        """Whether predictions differ between candidates (both classes have been seen)."""
        return getattr(self, "estimator_", None) is not None
