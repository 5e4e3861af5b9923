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

from collections.abc import Mapping
from typing import Any, Literal, overload

import numpy as np
from sklearn.exceptions import NotFittedError

__all__ = [
    "CopulaScale",
    "PerformanceModel",
    "PowerScale",
    "apply_transform",
    "dump_booster",
    "load_booster",
    "objective_transform",
    "transform_objective",
]


def transform_objective(values: np.ndarray, direction: str) -> np.ndarray:
    """Objective values to the model's scale, where lower is always better.

    ``minimize``: ``log(v)`` when every value is positive (times), else ``v``.
    ``maximize``: ``-log(v)`` when every value is positive (rates), else ``-v``.
    """
    v = np.asarray(values, dtype=np.float64)
    return apply_transform(v, direction, objective_transform(v))


def objective_transform(values: np.ndarray) -> str:
    """``"log"`` when every value is positive (times, rates), else ``"identity"``: the name a
    saved model records, so that its predictions are read back on the right scale."""
    v = np.asarray(values, dtype=np.float64)
    return "log" if len(v) and (v > 0).all() else "identity"


def apply_transform(values: np.ndarray, direction: str, transform: str) -> np.ndarray:
    """``values`` on the model's scale (lower is better) under a named transform."""
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize'; got {direction!r}")
    if transform not in ("log", "identity"):
        raise ValueError(f"transform must be 'log' or 'identity'; got {transform!r}")
    v = np.asarray(values, dtype=np.float64)
    y = np.log(v) if transform == "log" else v.copy()
    return y if direction == "minimize" else -y


class CopulaScale:
    """Normal scores of the ranks: the transformed objective as a standard normal's quantiles.

    A log keeps a kernel that runs 50 times slower than the rest 4 units away, and under squared
    loss one such measurement moves every tree that sees it: bootstrap members that hold it and
    members that do not then disagree over a whole region, and the ensemble's spread promises
    improvement where there is only disagreement (traced on the reduction recording,
    docs/BENCHMARKS.md). The Gaussian copula (as Salinas, Shen and Perrone, "A quantile-based
    approach for hyperparameter transfer learning", ICML 2020, use it on objectives of unknown
    scale) keeps the order and nothing else: the ``i``-th smallest of ``n`` values becomes
    ``Φ⁻¹((i - 0.5) / n)`` (ties share their mean rank), so no value lies further out than
    ``Φ⁻¹(0.5 / n)`` (2.6 at 100 measurements) and the fast end keeps its resolution.

    Values between the fitted ones are interpolated linearly; beyond them the line continues
    with the slope of the whole fitted range, so that a measurement faster than every fitted
    one still counts as an improvement on the model's scale.
    """

    def fit(self, y: np.ndarray) -> CopulaScale:
        """Learn the map from the values ``y`` (lower is better); returns self."""
        from scipy.special import ndtri
        from scipy.stats import rankdata

        y = np.asarray(y, dtype=np.float64)
        if y.ndim != 1 or len(y) == 0:
            raise ValueError(f"CopulaScale.fit needs a non-empty 1-D array; got shape {y.shape}")
        z = ndtri((rankdata(y, method="average") - 0.5) / len(y))
        self.y_, index = np.unique(y, return_index=True)
        self.z_ = z[index]
        span = float(self.y_[-1] - self.y_[0])
        self.slope_ = float(self.z_[-1] - self.z_[0]) / span if span > 0 else 1.0
        return self

    def transform(self, y: np.ndarray) -> np.ndarray:
        """``y`` on the copula scale (the fitted values to their normal scores)."""
        if not hasattr(self, "y_"):
            raise NotFittedError("CopulaScale is not fitted yet; call fit first")
        y = np.asarray(y, dtype=np.float64)
        z = np.interp(y, self.y_, self.z_)
        z = np.where(y < self.y_[0], self.z_[0] - (self.y_[0] - y) * self.slope_, z)
        return np.where(y > self.y_[-1], self.z_[-1] + (y - self.y_[-1]) * self.slope_, z)

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """Values on the copula scale back to the scale ``fit`` saw."""
        if not hasattr(self, "y_"):
            raise NotFittedError("CopulaScale is not fitted yet; call fit first")
        z = np.asarray(z, dtype=np.float64)
        y = np.interp(z, self.z_, self.y_)
        y = np.where(z < self.z_[0], self.y_[0] - (self.z_[0] - z) / self.slope_, y)
        return np.where(z > self.z_[-1], self.y_[-1] + (z - self.z_[-1]) / self.slope_, y)


class PowerScale:
    """A Yeo-Johnson power transform of the transformed objective, fitted by maximum likelihood
    (scikit-learn's ``PowerTransformer``, standardised), as HEBO (Cowen-Rivers et al., "HEBO:
    pushing the limits of sample-efficient hyper-parameter optimisation", JAIR 2022) warps its
    objective: a heavy slow tail is pulled in only as far as the data's skew asks, and the
    magnitudes at the fast end keep their meaning, which :class:`CopulaScale` gives up."""

    def fit(self, y: np.ndarray) -> PowerScale:
        from sklearn.preprocessing import PowerTransformer

        y = np.asarray(y, dtype=np.float64)
        if y.ndim != 1 or len(y) == 0:
            raise ValueError(f"PowerScale.fit needs a non-empty 1-D array; got shape {y.shape}")
        self.transformer_ = PowerTransformer(method="yeo-johnson").fit(y.reshape(-1, 1))
        return self

    def transform(self, y: np.ndarray) -> np.ndarray:
        if not hasattr(self, "transformer_"):
            raise NotFittedError("PowerScale is not fitted yet; call fit first")
        y = np.asarray(y, dtype=np.float64).reshape(-1, 1)
        return self.transformer_.transform(y).ravel()

    def inverse(self, z: np.ndarray) -> np.ndarray:
        if not hasattr(self, "transformer_"):
            raise NotFittedError("PowerScale is not fitted yet; call fit first")
        z = np.asarray(z, dtype=np.float64).reshape(-1, 1)
        return self.transformer_.inverse_transform(z).ravel()


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
        full_mean: fit one more member on every observation, whose prediction is the mean;
            the bootstrap members give only the spread around it. A bootstrap member never
            sees about a third of the rows, so their average smooths an optimum that one
            measurement shows (on Kernel Tuner's convolution recordings a member that misses
            the one fast configuration predicts its whole region slow).
        seed: seeds member ``k`` with ``seed + k``; the model is deterministic for a seed.
        n_jobs: XGBoost threads per model.
        forest: None (default: the XGBoost ensemble above), ``"mix"`` (each member the mean
            of its booster and of a forest of ``n_trees / n_models`` extremely randomised
            trees on the same resample), or ``"extra"`` / ``"random"``:
            instead, ``n_trees`` scikit-learn extremely randomised (Geurts et al. 2006) or CART
            trees, each on its own bootstrap resample (``max_features``, ``min_samples_leaf``
            as scikit-learn's), every tree a member. Screened against the ensemble
            (docs/BENCHMARKS.md, "Forests, a ranking objective, BORE"): it ranks unseen
            configurations better offline, searched worse (mean methodology score 0.711
            against 0.737 on 17 recordings, 20 seeds); not adopted, and a
            forest model cannot be saved in a bundle (:meth:`get_state` refuses it).
        n_trees: see ``forest``.
        min_samples_leaf: see ``forest``.
        max_features: see ``forest``.
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
        full_mean: bool = False,
        seed: int = 0,
        n_jobs: int = 1,
        forest: str | None = None,
        n_trees: int = 100,
        min_samples_leaf: int = 1,
        max_features: float = 0.5,
    ) -> None:
        self.forest = forest
        self.n_trees = n_trees
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.n_models = n_models
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.bootstrap = bootstrap
        self.full_mean = full_mean
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
        if self.forest not in (None, "extra", "random", "mix"):
            raise ValueError(
                f"forest must be None, 'extra', 'random' or 'mix'; got {self.forest!r}"
            )
        if self.forest in ("extra", "random"):
            from sklearn.tree import DecisionTreeRegressor, ExtraTreeRegressor

            cls = DecisionTreeRegressor if self.forest == "random" else ExtraTreeRegressor
            rng = np.random.default_rng(self.seed)
            self.trees_, self.rows_ = [], []
            for k in range(self.n_trees):
                rows = rng.integers(0, len(y), size=len(y))
                tree = cls(min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
                           random_state=self.seed * 1000 + k)
                self.trees_.append(tree.fit(X[rows], target[rows]))
                self.rows_.append(rows)
            self.boosters_ = []
            self.full_ = None
            return self
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
        def train(rows: np.ndarray, seed: int) -> Any:
            data = xgb.DMatrix(X[rows], label=target[rows], nthread=self.n_jobs)
            return xgb.train({**params, "seed": seed}, data, num_boost_round=self.n_estimators)

        self.boosters_ = []
        self.rows_ = []
        for k in range(self.n_models):
            rng = np.random.default_rng(self.seed + k)
            rows = (
                rng.integers(0, len(y), size=len(y))
                if self.bootstrap and self.n_models > 1
                else np.arange(len(y))
            )
            self.rows_.append(rows)
            self.boosters_.append(train(rows, self.seed + k))
        self.trees_ = None  # a refit without a forest leaves no trees behind
        self.mix_ = []
        if self.forest == "mix":  # each member: its booster and a forest on the same rows
            from sklearn.ensemble import ExtraTreesRegressor

            for k, rows in enumerate(self.rows_):
                forest = ExtraTreesRegressor(
                    n_estimators=max(1, self.n_trees // self.n_models), bootstrap=False,
                    min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
                    random_state=self.seed + k,
                )
                self.mix_.append(forest.fit(X[rows], target[rows]))
        everything = np.arange(len(y))
        self.full_ = train(everything, self.seed + self.n_models) if self.full_mean else None
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
        preds = self.predict_members(X)
        mean = preds.mean(axis=0)
        if not return_std:
            return mean
        return mean, preds.std(axis=0)

    def predict_members(self, X: np.ndarray) -> np.ndarray:
        """``(K, n)``: each member's prediction on the target's scale (the ensemble's samples,
        which a warm start ranks candidates with). With ``full_mean`` the members are moved
        so that their mean is the full member's prediction, their spread unchanged."""
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
        if getattr(self, "trees_", None) is not None:
            preds = np.stack([t.predict(X) for t in self.trees_])
            return preds.astype(np.float64) * self.y_scale_ + self.y_mean_
        preds = np.stack([b.inplace_predict(X) for b in self.boosters_]).astype(np.float64)
        if getattr(self, "mix_", None):
            preds = 0.5 * (preds + np.stack([f.predict(X) for f in self.mix_]))
        full = getattr(self, "full_", None)
        if full is not None:
            preds += full.inplace_predict(X).astype(np.float64) - preds.mean(axis=0)
        return preds * self.y_scale_ + self.y_mean_

    def out_of_bag(self, n: int) -> np.ndarray:
        """``(K, n)`` booleans: which of the ``n`` training rows each member never saw.

        Member ``k``'s predictions on its out-of-bag rows are honest (cross-validated) ones: a
        warm start compares them with a source model's to decide whom to believe. All False
        without bootstrap (every member saw every row).
        """
        rows = getattr(self, "rows_", None)
        if rows is None:
            raise NotFittedError("This PerformanceModel instance is not fitted yet.")
        out = np.ones((len(rows), n), dtype=bool)
        for k, used in enumerate(rows):
            out[k, used] = False
        return out

    def get_state(self) -> dict[str, Any]:
        """Parameters and fitted state as plain JSON data: each member in XGBoost's own JSON
        model format, which any XGBoost (Python, R, C, JVM) loads, so that a saved model does
        not depend on pickle or on this version of surrotune's classes."""
        if not hasattr(self, "boosters_"):
            raise NotFittedError("This PerformanceModel instance is not fitted yet.")
        if self.forest is not None:
            raise ValueError(
                f"a PerformanceModel(forest={self.forest!r}) cannot be saved: a bundle holds "
                "XGBoost members in XGBoost's own format; save a study searched with the "
                "default model"
            )
        params = {name: getattr(self, name) for name in _PARAMS}
        state = {
            "params": params,
            "n_features_in": self.n_features_in_,
            "y_mean": self.y_mean_,
            "y_scale": self.y_scale_,
            "boosters": [dump_booster(b) for b in self.boosters_],
        }
        if getattr(self, "full_", None) is not None:
            state["full"] = dump_booster(self.full_)
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PerformanceModel:
        """The model :meth:`get_state` saved; predictions are identical to the original's."""
        model = cls(**{k: v for k, v in state["params"].items() if k in _PARAMS})
        model.n_features_in_ = int(state["n_features_in"])
        model.y_mean_ = float(state["y_mean"])
        model.y_scale_ = float(state["y_scale"])
        model.boosters_ = [load_booster(b) for b in state["boosters"]]
        model.full_ = load_booster(state["full"]) if state.get("full") else None
        return model


#: the constructor's parameters, saved with a model
_PARAMS = (
    "n_models", "n_estimators", "max_depth", "learning_rate", "subsample", "colsample_bytree",
    "min_child_weight", "bootstrap", "full_mean", "seed", "n_jobs",
)  # fmt: skip


def dump_booster(booster: Any) -> Any:
    """An ``xgboost.Booster`` in XGBoost's JSON model format, parsed into a dict (what
    :func:`load_booster` reads back): portable, and embeddable in a bundle's JSON."""
    import json

    return json.loads(bytes(booster.save_raw("json")))


def load_booster(model: Mapping[str, Any]) -> Any:
    """An ``xgboost.Booster`` from XGBoost's JSON model format (parsed into a dict)."""
    import json

    import xgboost as xgb

    return xgb.Booster(model_file=bytearray(json.dumps(model).encode()))
