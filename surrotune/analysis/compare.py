"""Several studies side by side: the same kernel on two GPUs, two samplers, two code versions.

Configurations are matched by their parameter values (studies of one kernel share the names;
their order may differ). For each ordered pair of studies (A, B) the question a user asks is
*how well does A's winner do on B?*:

- when B measured that configuration: its status and value on B, its rank among B's ok
  measurements and the fraction of B's best it reaches (``B's best / value`` for times,
  ``value / B's best`` for rates; 1.0 means it is B's winner too);
- when B did not: B's surrogate (the regressor of :mod:`surrotune.analysis.importance`, fitted on
  B's ok trials) predicts its value, and so its rank and fraction, marked as a prediction.

And for the configurations both measured: how far the two rankings agree (Spearman's rho and
Kendall's tau of the objective), and how many configurations ran on one and failed on the other.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from surrotune.analysis.trials import StudyTrials

if TYPE_CHECKING:
    from surrotune.analysis.importance import ConfigRegressor

__all__ = ["Comparison", "common_values", "compare_studies", "config_keys"]


def config_keys(study: StudyTrials, rows: pd.DataFrame, names: Sequence[str]) -> list[Hashable]:
    """A hashable key per row from the values of ``names`` (``16`` and ``16.0`` match)."""
    columns = [rows[study.column(n)].tolist() for n in names]
    return [tuple(values) for values in zip(*columns, strict=True)]


@dataclass(frozen=True)
class Comparison:
    """The side-by-side tables of several studies (see the module docstring)."""

    summary: pd.DataFrame
    statuses: pd.DataFrame
    cross: pd.DataFrame
    agreement: pd.DataFrame
    aligned: bool
    note: str = ""


def _fraction(value: float, best: float, maximize: bool) -> float:
    if not (math.isfinite(value) and math.isfinite(best)) or value == 0 or best == 0:
        return math.nan
    return value / best if maximize else best / value


def _rank(value: float, values: np.ndarray, maximize: bool) -> int:
    """1 + how many of ``values`` are strictly better than ``value``."""
    return 1 + int(np.sum(values > value) if maximize else np.sum(values < value))


def _summary(studies: Sequence[StudyTrials]) -> pd.DataFrame:
    rows = []
    for study in studies:
        best = study.best
        counts = study.status_counts()
        rows.append(
            {
                "study": study.name,
                "device": study.device_name,
                "kernel": study.kernel,
                "measured": len(study.measured),
                "ok": int(counts.get("ok", 0)),
                "failed": int(counts.drop("ok", errors="ignore").sum()),
                "best": float(best["value"]) if best is not None else math.nan,
                "unit": study.unit,
                "best trial": int(best["number"]) if best is not None else None,
                "best configuration": study.config_text(best) if best is not None else "",
            }
        )
    frame = pd.DataFrame(rows)
    return frame.drop(columns=[c for c in ("kernel",) if not frame[c].astype(bool).any()])


def _statuses(studies: Sequence[StudyTrials]) -> pd.DataFrame:
    table = pd.concat({s.name: s.status_counts() for s in studies}, axis=1)
    return table.fillna(0).astype(int).rename_axis("status").reset_index()


def _predictor(study: StudyTrials, names: Sequence[str]) -> tuple[ConfigRegressor, bool] | None:
    """B's surrogate over ``names`` (None when B has too few ok trials)."""
    from surrotune.analysis.importance import MIN_TRIALS, ConfigRegressor, value_positions
    from surrotune.surrogate.performance import transform_objective

    ok = study.ranked
    if len(ok) < MIN_TRIALS:
        return None
    X = value_positions(study, ok, names)
    values = ok["value"].to_numpy(dtype=float)
    positive = bool((values > 0).all())
    y = transform_objective(values, study.direction)
    choices = tuple(tuple(study.parameters[n]) for n in names)
    return ConfigRegressor(choices).fit(X, y), positive


def _cross(studies: Sequence[StudyTrials], names: Sequence[str]) -> pd.DataFrame:
    rows = []
    predictors: dict[int, tuple[ConfigRegressor, bool] | None] = {}  # by id(study)
    for source, target in itertools.permutations(studies, 2):
        if set(source.parameters) != set(target.parameters):
            continue
        best = source.best
        if best is None:
            continue
        key = config_keys(source, best.to_frame().T, names)[0]
        measured = target.measured
        where = [i for i, k in enumerate(config_keys(target, measured, names)) if k == key]
        ok_values = target.ranked["value"].to_numpy(dtype=float)
        target_best = float(ok_values[0]) if len(ok_values) else math.nan
        row = {
            "best of": source.name,
            "configuration": source.config_text(best),
            "on": target.name,
            "status there": "not measured",
            "value there": math.nan,
            "best there": target_best,
            "fraction of best": math.nan,
            "rank there": "",
            "predicted": False,
        }
        if where:
            there = measured.iloc[where[0]]
            row["status there"] = str(there["status"])
            if there["status"] == "ok":
                value = float(there["value"])
                row["value there"] = value
                row["fraction of best"] = _fraction(value, target_best, target.maximize)
                rank = _rank(value, ok_values, target.maximize)
                row["rank there"] = f"{rank} of {len(ok_values)}"
        else:
            predicted = _predict(target, best, source, names, predictors)
            if predicted is not None:
                row["value there"] = predicted
                row["fraction of best"] = _fraction(predicted, target_best, target.maximize)
                rank = _rank(predicted, ok_values, target.maximize)
                row["rank there"] = f"~{rank} of {len(ok_values)} (predicted)"
                row["predicted"] = True
        rows.append(row)
    return pd.DataFrame(rows)


def _predict(
    target: StudyTrials,
    best: pd.Series,
    source: StudyTrials,
    names: Sequence[str],
    cache: dict[int, tuple[ConfigRegressor, bool] | None],
) -> float | None:
    from surrotune.analysis.importance import from_model_scale

    if id(target) not in cache:
        cache[id(target)] = _predictor(target, names)
    fitted = cache[id(target)]
    if fitted is None:
        return None
    model, positive = fitted
    config = {n: best[source.column(n)] for n in names}
    positions = []
    for name in names:
        values = target.parameters[name]
        if config[name] not in values:
            return None  # a value the target never offered: no prediction
        positions.append(values.index(config[name]))
    y = model.predict(np.asarray([positions], dtype=float))
    return float(from_model_scale(target, y, positive)[0])


def _agreement(studies: Sequence[StudyTrials], names: Sequence[str]) -> pd.DataFrame:
    from scipy.stats import kendalltau, spearmanr

    rows = []
    for a, b in itertools.combinations(studies, 2):
        if set(a.parameters) != set(b.parameters):
            continue
        status_a = dict(zip(config_keys(a, a.measured, names), a.measured["status"], strict=True))
        status_b = dict(zip(config_keys(b, b.measured, names), b.measured["status"], strict=True))
        value_a = dict(zip(config_keys(a, a.ranked, names), a.ranked["value"], strict=True))
        value_b = dict(zip(config_keys(b, b.ranked, names), b.ranked["value"], strict=True))
        both = [k for k in status_a if k in status_b]
        common = [k for k in value_a if k in value_b]
        x = np.array([value_a[k] for k in common], dtype=float)
        y = np.array([value_b[k] for k in common], dtype=float)
        enough = len(common) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0
        rows.append(
            {
                "studies": f"{a.name} / {b.name}",
                "measured by both": len(both),
                "ok on both": len(common),
                "ok on the first only": sum(
                    status_a[k] == "ok" and status_b[k] != "ok" for k in both
                ),
                "ok on the second only": sum(
                    status_b[k] == "ok" and status_a[k] != "ok" for k in both
                ),
                "spearman": float(spearmanr(x, y).statistic) if enough else math.nan,
                "kendall": float(kendalltau(x, y).statistic) if enough else math.nan,
            }
        )
    return pd.DataFrame(rows)


def common_values(a: StudyTrials, b: StudyTrials) -> tuple[list[Hashable], np.ndarray, np.ndarray]:
    """The configurations ok on both studies, with their values on each."""
    names = list(a.parameters)
    value_a = dict(zip(config_keys(a, a.ranked, names), a.ranked["value"], strict=True))
    value_b = dict(zip(config_keys(b, b.ranked, names), b.ranked["value"], strict=True))
    common = [k for k in value_a if k in value_b]
    return (
        common,
        np.array([value_a[k] for k in common], dtype=float),
        np.array([value_b[k] for k in common], dtype=float),
    )


def compare_studies(studies: Sequence[StudyTrials]) -> Comparison:
    """Compare two studies or more (see the module docstring)."""
    if len(studies) < 2:
        raise ValueError(f"a comparison needs two studies or more, got {len(studies)}")
    summary, statuses = _summary(studies), _statuses(studies)
    groups: dict[frozenset[str], list[StudyTrials]] = {}
    for study in studies:
        groups.setdefault(frozenset(study.parameters), []).append(study)
    note = ""
    if len(groups) > 1:
        note = (
            "Only studies of the same parameters can be matched configuration by configuration: "
            + "; ".join(
                " and ".join(f"'{s.name}'" for s in group) + f" ({', '.join(group[0].parameters)})"
                for group in groups.values()
            )
            + "."
        )
    matched = [group for group in groups.values() if len(group) > 1]
    if not matched:
        return Comparison(summary, statuses, pd.DataFrame(), pd.DataFrame(), False, note)
    cross = pd.concat([_cross(g, list(g[0].parameters)) for g in matched], ignore_index=True)
    agreement = [_agreement(g, list(g[0].parameters)) for g in matched]
    return Comparison(
        summary, statuses, cross, pd.concat(agreement, ignore_index=True), True, note
    )
