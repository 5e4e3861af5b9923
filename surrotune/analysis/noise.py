"""Measurement noise: the spread of each configuration's repeats, and whether the ranking of the
top configurations is beyond it.

A ranking is only as good as the timing behind it. For every ``ok`` measurement with two repeats
or more (``times_ms``), this module gives the spread (coefficient of variation and interquartile
range, relative to the median) and the distribution-free 95 % confidence interval of the median
(order statistics of the binomial, SciPy's :func:`~scipy.stats.quantile_test`, the interval that
``timing_precision`` describes, docs/trials.md). For the top configurations it tests each against
the winner and against the next rank with the Mann-Whitney U test on their repeats: two
configurations whose repeats could come from one distribution (p >= 0.05) are *within noise* of
each other, and their order in the ranking is not established by the measurements. Where the run
measured the top configurations again (``--remeasure``), their re-measured medians and the run's
verdict are shown beside them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from surrotune.analysis.trials import StudyTrials, remeasure_report

__all__ = ["ALPHA", "Noise", "measurement_noise", "median_interval"]

#: the significance level of "beyond noise"
ALPHA = 0.05


def median_interval(
    times: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> tuple[float, float]:
    """The distribution-free confidence interval of the median (NaN where too few repeats)."""
    from scipy.stats import quantile_test

    x = np.asarray(times, dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    interval = quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    low, high = float(interval.low), float(interval.high)
    return (low if math.isfinite(low) else math.nan, high if math.isfinite(high) else math.nan)


def _spread(times: Sequence[float], *, interval: bool = True) -> dict[str, float]:
    x = np.asarray(times, dtype=float)
    median = float(np.median(x))
    q1, q3 = np.percentile(x, [25, 75])
    low, high = median_interval(x) if interval else (math.nan, math.nan)
    return {
        "repeats": len(x),
        "median_ms": median,
        "cv_pct": 100 * float(np.std(x, ddof=1) / np.mean(x)) if len(x) > 1 else math.nan,
        "iqr_pct": 100 * float(q3 - q1) / median if median else math.nan,
        "min_ms": float(x.min()),
        "max_ms": float(x.max()),
        "ci_low_ms": low,
        "ci_high_ms": high,
    }


def _p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value; NaN when either side has fewer than two repeats."""
    from scipy.stats import mannwhitneyu

    if len(a) < 2 or len(b) < 2:
        return math.nan
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0  # every repeat identical: nothing tells them apart
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class Noise:
    """The spread of repeats per configuration and the top ranking against it."""

    spread: pd.DataFrame  # one row per ok measurement with >= 2 repeats
    top: pd.DataFrame  # the top configurations, best first, with their tests
    within_noise_of_best: int  # how many of the top (the winner included) the noise cannot order
    remeasure: Mapping[str, Any] | None
    text: str

    @property
    def has_repeats(self) -> bool:
        return not self.spread.empty


def _times(row: pd.Series) -> list[float]:
    times = row.get("times_ms")
    return [float(t) for t in times] if isinstance(times, list | tuple) else []


def measurement_noise(study: StudyTrials, *, top: int = 10) -> Noise:
    """Spread of the repeats of every ok measurement, and the top ``top`` tested against it."""
    ranked = study.ranked
    rows = []
    for _, row in ranked.iterrows():
        times = _times(row)
        if len(times) >= 2:
            stats = _spread(times, interval=False)
            rows.append({"number": int(row["number"]), "value": row["value"], **stats})
    spread = pd.DataFrame(rows)
    head = ranked.head(top)
    best_times = _times(head.iloc[0]) if len(head) else []
    lines = []
    previous: list[float] = []
    for rank, (_, row) in enumerate(head.iterrows(), start=1):
        times = _times(row)
        stats = _spread(times) if len(times) >= 2 else {"repeats": len(times)}
        remeasured = row.get("remeasured_ms") or []
        lines.append(
            {
                "rank": rank,
                "number": int(row["number"]),
                "value": float(row["value"]),
                "vs_best_pct": 100 * (float(row["value"]) / float(head.iloc[0]["value"]) - 1),
                **stats,
                "p_vs_best": math.nan if rank == 1 else _p_value(times, best_times),
                "p_vs_previous": math.nan if rank == 1 else _p_value(times, previous),
                "remeasured_ms": float(np.median(remeasured)) if len(remeasured) else math.nan,
            }
        )
        previous = times
    table = pd.DataFrame(lines)
    within = 1
    if len(table) > 1:
        p = table["p_vs_best"].to_numpy(dtype=float)[1:]
        within += int(np.sum(np.nan_to_num(p, nan=0.0) >= ALPHA))
    remeasure = remeasure_report(study)
    return Noise(spread, table, within, remeasure, _describe(study, spread, table, within))


def _describe(study: StudyTrials, spread: pd.DataFrame, top: pd.DataFrame, within: int) -> str:
    if top.empty:
        return "No ok measurement: nothing to rank."
    if spread.empty:
        return (
            "The trials carry no repeated timings (times_ms), so their noise is unknown; the "
            "ranking rests on one value per configuration."
        )
    cv = spread["cv_pct"].dropna()
    parts = [
        f"{len(spread)} ok configurations carry repeated timings (median "
        f"{int(spread['repeats'].median())} repeats); the coefficient of variation of their "
        f"repeats is {cv.median():.2f} % at the median and {cv.quantile(0.9):.2f} % at the "
        "90th percentile."
    ]
    tested = top["p_vs_best"].iloc[1:].dropna()
    if tested.empty:
        parts.append("The runners-up carry no repeats to test against the winner.")
    elif within > 1:
        close = top[top["p_vs_best"] >= ALPHA]
        ranks = ", ".join(f"#{int(r)}" for r in close["rank"])
        parts.append(
            f"The winner is NOT established beyond noise: {ranks} cannot be told apart from it "
            f"(Mann-Whitney p >= {ALPHA} on their repeats; up to "
            f"{close['vs_best_pct'].abs().max():.2f} % apart). Measure them again "
            "(`surrotune run ... --remeasure K`) before choosing."
        )
    else:
        parts.append(
            f"Each of the top {len(top)} differs from the winner beyond noise (Mann-Whitney "
            f"p < {ALPHA}); the closest is {abs(top['vs_best_pct'].iloc[1]):.2f} % "
            f"{'below' if study.maximize else 'slower'}."
        )
    ties = top[(top["rank"] > 1) & (top["p_vs_previous"] >= ALPHA)]
    if len(ties):
        pairs = ", ".join(f"#{int(r) - 1}/#{int(r)}" for r in ties["rank"])
        parts.append(f"Adjacent ranks within noise of each other: {pairs}.")
    return " ".join(parts)
