"""What matters: parameter importance (two views) and partial dependence, from the ok trials.

Two estimates, because each has its blind spot:

- **fANOVA** (Optuna's :class:`~optuna.importance.FanovaImportanceEvaluator`, Hutter et al.
  2014): a random forest on the parameters, with the variance of the objective decomposed over
  them. Numeric parameters are handed over as ordered (a float range), so the forest splits on
  their order, as the values mean; the target is ``log(time)`` (or ``-log(rate)``), because
  kernel times matter relatively.
- **the surrogate's own**: the sampler's XGBoost regressor
  (:class:`surrotune.surrogate.performance.PerformanceModel`) on its own features
  (:mod:`surrotune.surrogate.features`: the parameters plus the log of each pair's product and
  ratio), with scikit-learn's permutation importance per *parameter*: a parameter is shuffled
  and every feature derived from it follows, so a parameter that acts only through a product is
  still credited. It is measured on held-out folds, beside the model's cross-validated R², which
  says how far to trust it.

Partial dependence (scikit-learn's :func:`~sklearn.inspection.partial_dependence`) of the
objective on the top parameters uses the same fitted model: the model's prediction averaged over
the measured configurations, with one parameter (or a pair) set to each of its values, and taken
back to the objective's unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin

from surrotune.analysis.trials import StudyTrials
from surrotune.surrogate.features import make_features, positive_columns
from surrotune.surrogate.performance import PerformanceModel, transform_objective

__all__ = [
    "MIN_TRIALS",
    "ConfigRegressor",
    "Dependence",
    "Importance",
    "fanova_importance",
    "from_model_scale",
    "parameter_importance",
    "partial_dependences",
    "value_positions",
]

#: the fewest ok measurements an importance estimate is attempted on
MIN_TRIALS = 8


class ConfigRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn: untyped
    """The surrogate's regressor over configurations given as value positions.

    ``X`` holds, per configuration, the position of each parameter's value in ``choices`` (one
    column per parameter), so that scikit-learn's permutation importance and partial dependence
    act on *parameters*; the features the model sees (:func:`make_features`) are derived inside.
    Follows the scikit-learn contract (``fit`` returns self, learned attributes end in ``_``).
    """

    def __init__(
        self,
        choices: tuple[tuple[Any, ...], ...] = (),
        *,
        n_estimators: int = 150,
        max_depth: int = 4,
        seed: int = 0,
    ) -> None:
        self.choices = choices
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.seed = seed

    def _tables(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        encoded, raw = [], []
        for values in self.choices:
            n = len(values)
            encoded.append(np.arange(n, dtype=float) / max(n - 1, 1))
            numeric = all(
                isinstance(v, int | float | np.number) and not isinstance(v, bool) for v in values
            )
            raw.append(np.asarray(values, dtype=float) if numeric else np.full(n, np.nan))
        return encoded, raw

    def _features(self, X: np.ndarray) -> np.ndarray:
        positions = np.asarray(X, dtype=float).round().astype(np.int64)
        encoded_tables, raw_tables = self._tables()
        encoded = np.column_stack([t[positions[:, k]] for k, t in enumerate(encoded_tables)])
        raw = np.column_stack([t[positions[:, k]] for k, t in enumerate(raw_tables)])
        return make_features(encoded, raw, pair_columns=self.pair_columns_)

    def fit(self, X: np.ndarray, y: np.ndarray) -> ConfigRegressor:
        """Fit the model on configurations ``X`` (value positions) and targets ``y``."""
        _, raw_tables = self._tables()
        # pairs chosen from the values the space offers, not from this sample (features.py)
        every = np.full((max(len(t) for t in raw_tables), len(raw_tables)), np.nan)
        for k, table in enumerate(raw_tables):
            every[:, k] = np.resize(table, every.shape[0])
        self.pair_columns_ = positive_columns(every)
        self.model_ = PerformanceModel(
            n_models=1,
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            bootstrap=False,
            subsample=1.0,
            colsample_bytree=1.0,
            seed=self.seed,
        ).fit(self._features(X), np.asarray(y, dtype=float))
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict(self._features(X))


@dataclass(frozen=True)
class Importance:
    """Importance of each parameter by both estimates (a row per parameter, best first)."""

    table: pd.DataFrame  # parameter, fanova, surrogate, surrogate_sd
    r2: float | None  # the surrogate's cross-validated R² on the ok trials (log scale)
    trials: int
    model: ConfigRegressor | None
    note: str = ""

    def top(self, k: int) -> list[str]:
        return list(self.table["parameter"][:k])


@dataclass(frozen=True)
class Dependence:
    """Partial dependence of the objective on one parameter or a pair."""

    parameters: tuple[str, ...]
    values: tuple[list[Any], ...]  # each parameter's values, in the study's order
    average: np.ndarray  # objective units; shape (len(values[0]),) or (n0, n1)
    observed: np.ndarray | None = None  # median measured objective per value (1-D only)


def _varying(study: StudyTrials, ok: pd.DataFrame) -> list[str]:
    """Parameters that take two values or more among the ok measurements."""
    return [p for p in study.parameters if ok[study.column(p)].nunique() > 1]


def _target(study: StudyTrials, values: np.ndarray) -> np.ndarray:
    return transform_objective(values, study.direction)


def from_model_scale(study: StudyTrials, y: np.ndarray, positive: bool) -> np.ndarray:
    """The model's scale back to the objective's unit (the inverse of transform_objective)."""
    y = np.asarray(y, dtype=float)
    y = -y if study.maximize else y
    return np.exp(y) if positive else y


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def fanova_importance(study: StudyTrials, *, seed: int = 0) -> pd.Series:
    """Optuna's fANOVA importance of each varying parameter (summing to 1), largest first."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    ok = study.ranked
    names = _varying(study, ok)
    if len(ok) < MIN_TRIALS or not names:
        return pd.Series(dtype=float)
    distributions: dict[str, Any] = {}
    for name in names:
        values = study.parameters[name]
        if _numeric(values):
            distributions[name] = FloatDistribution(float(min(values)), float(max(values)))
        else:
            distributions[name] = CategoricalDistribution(values)
    target = _target(study, ok["value"].to_numpy(dtype=float))
    trials = [
        optuna.trial.create_trial(
            params={
                n: float(row[study.column(n)])
                if isinstance(distributions[n], FloatDistribution)
                else row[study.column(n)]
                for n in names
            },
            distributions=distributions,
            value=float(y),
        )
        for (_, row), y in zip(ok.iterrows(), target, strict=True)
    ]
    # an in-memory copy of the ok measurements: duplicates, demoted and failed trials left out
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory"
    try:
        copy = optuna.create_study(direction="minimize")
        copy.add_trials(trials)
        importances = get_param_importances(
            copy, evaluator=FanovaImportanceEvaluator(seed=seed), normalize=True
        )
    finally:
        optuna.logging.set_verbosity(verbosity)
    return pd.Series(importances, dtype=float).sort_values(ascending=False)


def value_positions(study: StudyTrials, rows: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """Each row's position of each parameter's value in the study's value list (the model's X)."""
    columns = []
    for name in names:
        lookup = {value: i for i, value in enumerate(study.parameters[name])}
        columns.append([lookup.get(v, 0) for v in rows[study.column(name)]])
    return np.asarray(columns, dtype=float).T


def parameter_importance(study: StudyTrials, *, seed: int = 0, folds: int = 5) -> Importance:
    """fANOVA and the surrogate's permutation importance, side by side.

    The surrogate is scored on ``folds`` held-out folds (permutation importance on each held-out
    part, averaged; R² from the out-of-fold predictions), then refitted on every ok trial for
    the partial dependence.
    """
    from sklearn.inspection import permutation_importance
    from sklearn.metrics import r2_score
    from sklearn.model_selection import KFold

    ok = study.ranked
    names = _varying(study, ok)
    if len(ok) < MIN_TRIALS or not names:
        empty = pd.DataFrame(columns=["parameter", "fanova", "surrogate", "surrogate_sd"])
        note = (
            f"{len(ok)} ok measurements"
            + ("" if names else ", no parameter varies among them")
            + f": too few to estimate importance (at least {MIN_TRIALS} needed)"
        )
        return Importance(empty, None, len(ok), None, note)
    fanova = fanova_importance(study, seed=seed)
    X = value_positions(study, ok, names)
    y = _target(study, ok["value"].to_numpy(dtype=float))
    choices = tuple(tuple(study.parameters[n]) for n in names)
    splits = KFold(n_splits=min(folds, len(ok) // 2), shuffle=True, random_state=seed)
    scores = np.zeros((len(names), 0))
    predicted = np.zeros_like(y)
    for train, test in splits.split(X):
        fold = ConfigRegressor(choices, seed=seed).fit(X[train], y[train])
        predicted[test] = fold.predict(X[test])
        result = permutation_importance(
            fold, X[test], y[test], n_repeats=5, random_state=seed,
            scoring="neg_mean_squared_error",
        )  # fmt: skip
        scores = np.concatenate([scores, result.importances], axis=1)
    r2 = float(r2_score(y, predicted)) if np.ptp(y) > 0 else None
    model = ConfigRegressor(choices, seed=seed).fit(X, y)
    mean = np.clip(scores.mean(axis=1), 0.0, None)
    total = mean.sum() or 1.0
    table = pd.DataFrame(
        {
            "parameter": names,
            "fanova": [float(fanova.get(n, np.nan)) for n in names],
            "surrogate": mean / total,
            "surrogate_sd": scores.std(axis=1) / total,
        }
    )
    table["rank"] = table[["fanova", "surrogate"]].fillna(0).mean(axis=1)
    table = table.sort_values("rank", ascending=False).drop(columns="rank")
    return Importance(table.reset_index(drop=True), r2, len(ok), model)


def _dependence(
    model: ConfigRegressor, X: np.ndarray, features: list[Any], grids: dict[int, np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """scikit-learn's partial dependence at every value position of the chosen parameters.

    ``custom_values`` (scikit-learn 1.7) evaluates values the sample may lack; older versions
    evaluate the positions present in the sample.
    """
    from sklearn.inspection import partial_dependence

    try:
        result = partial_dependence(model, X, features, custom_values=grids, kind="average")
    except TypeError:  # scikit-learn < 1.7
        result = partial_dependence(
            model, X, features, percentiles=(0, 1), grid_resolution=256, kind="average"
        )
    return result["average"][0], list(result["grid_values"])


def partial_dependences(
    study: StudyTrials, importance: Importance, *, top: int = 4
) -> list[Dependence]:
    """The partial dependence on each of the ``top`` parameters, then on the top pair."""
    model = importance.model
    if model is None:
        return []
    ok = study.ranked
    names = list(importance.table["parameter"])
    names = [n for n in study.parameters if n in names]  # the model's column order
    X = value_positions(study, ok, names)
    values = ok["value"].to_numpy(dtype=float)
    positive = bool(len(values)) and bool((values > 0).all())
    chosen = importance.top(top)
    out = []
    for name in chosen:
        k = names.index(name)
        choices = study.parameters[name]
        average, (grid,) = _dependence(model, X, [k], {k: np.arange(len(choices), dtype=float)})
        at = [choices[int(p)] for p in grid]
        column = ok[study.column(name)].to_numpy()
        observed = np.array(
            [np.median(values[column == v]) if np.any(column == v) else math.nan for v in at]
        )
        out.append(
            Dependence((name,), (at,), from_model_scale(study, average, positive), observed)
        )
    if len(chosen) >= 2:
        a, b = names.index(chosen[0]), names.index(chosen[1])
        grids = {k: np.arange(len(study.parameters[names[k]]), dtype=float) for k in (a, b)}
        average, (grid_a, grid_b) = _dependence(model, X, [(a, b)], grids)
        out.append(
            Dependence(
                (chosen[0], chosen[1]),
                (
                    [study.parameters[chosen[0]][int(p)] for p in grid_a],
                    [study.parameters[chosen[1]][int(p)] for p in grid_b],
                ),
                from_model_scale(study, average, positive),
            )
        )
    return out
