"""Which configurations to profile, within what budget.

Profiling costs seconds per configuration (ncu replays each kernel once per group of metrics),
so it is spent where it explains something:

``elite``
    the best configurations found: what limits the winners is what the next design change must
    attack (and whether they are at a roof, so that tuning is done).
``failures``
    the *performance failures*: configurations much slower than the model predicted (its
    prediction is stored on the trial by the SurrogateSampler, when it made one), or far behind
    the best. Their counters say which region of the space to avoid and why.
``all``
    every measured configuration (for recordings that carry counters for every trial).
``none``
    nothing.

The budget is a share of the run's wall time; with the cost of one profiled configuration
measured on the first batch, it becomes a number of configurations.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

__all__ = ["PREDICTION_ATTR", "Choice", "CountersMode", "CountersPolicy"]

#: the trial system attribute where a sampler leaves its predicted objective for the trial
PREDICTION_ATTR = "surrotune:predicted_objective"


class CountersMode(enum.StrEnum):
    NONE = "none"
    ELITE = "elite"
    FAILURES = "failures"
    ALL = "all"


@dataclass(frozen=True)
class Choice:
    """A trial to profile and why it was chosen."""

    number: int
    config: Mapping[str, Any]
    reason: str


@dataclass(frozen=True)
class CountersPolicy:
    """What :meth:`choose` picks, see the module docstring.

    Args:
        mode: none, elite, failures or all.
        budget_share: share of the run's wall time profiling may take.
        elite: how many of the best configurations ``elite`` profiles.
        behind_best: an ok configuration this many times worse than the best is a failure.
        surprise: or this many times worse than its prediction.
    """

    mode: CountersMode = CountersMode.NONE
    budget_share: float = 0.1
    elite: int = 5
    behind_best: float = 2.0
    surprise: float = 1.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", CountersMode(self.mode))
        if not 0.0 < self.budget_share <= 1.0:
            raise ValueError(f"budget_share must be in (0, 1], got {self.budget_share}")

    def budget(self, run_wall_s: float, cost_per_config_s: float | None) -> int | None:
        """How many configurations fit in the budget (None: not known yet, profile one batch)."""
        if cost_per_config_s is None or cost_per_config_s <= 0:
            return None
        return max(0, math.floor(self.budget_share * run_wall_s / cost_per_config_s))

    def choose(
        self,
        trials: Iterable[FrozenTrial],
        *,
        minimize: bool = True,
        already: set[int] | frozenset[int] = frozenset(),
        limit: int | None = None,
    ) -> list[Choice]:
        """The trials to profile next, most informative first, at most ``limit``; trials in
        ``already`` (by number) were profiled before and are skipped."""
        if self.mode is CountersMode.NONE or limit == 0:
            return []
        ok = [
            t for t in trials
            if t.state == TrialState.COMPLETE and t.value is not None
            and t.user_attrs.get("status", "ok") == "ok" and "duplicate_of" not in t.user_attrs
        ]  # fmt: skip
        if not ok:
            return []
        sign = 1.0 if minimize else -1.0
        ranked = sorted(ok, key=lambda t: (sign * float(t.value), t.number))  # type: ignore[arg-type]
        chosen: list[Choice] = []
        if self.mode is CountersMode.ELITE:
            chosen = [
                Choice(t.number, t.params, f"elite: rank {i + 1}")
                for i, t in enumerate(ranked[: self.elite])
            ]
        elif self.mode is CountersMode.ALL:
            chosen = [Choice(t.number, t.params, "all") for t in ranked]
        else:
            chosen = self._failures(ranked, minimize)
        fresh = [c for c in chosen if c.number not in already]
        return fresh if limit is None else fresh[:limit]

    def _failures(self, ranked: list[FrozenTrial], minimize: bool) -> list[Choice]:
        """Performance failures, the worst surprise first, then the furthest behind the best."""
        best = float(ranked[0].value)  # type: ignore[arg-type]

        def worse(value: float, than: float) -> float:
            """How many times worse ``value`` is than ``than`` (>1: worse), for either sense."""
            if than <= 0 or value <= 0:
                return math.inf if (value > than) == minimize and value != than else 1.0
            return value / than if minimize else than / value

        scored: list[tuple[float, int, Choice]] = []
        for t in ranked[1:]:
            value = float(t.value)  # type: ignore[arg-type]
            predicted = t.system_attrs.get(PREDICTION_ATTR)
            if isinstance(predicted, int | float) and math.isfinite(predicted):
                ratio = worse(value, float(predicted))
                if ratio >= self.surprise:
                    reason = f"failure: {ratio:.1f}x worse than predicted"
                    scored.append((ratio * 1e3, t.number, Choice(t.number, t.params, reason)))
                    continue
            behind = worse(value, best)
            if behind >= self.behind_best:
                reason = f"failure: {behind:.1f}x worse than the best"
                scored.append((behind, t.number, Choice(t.number, t.params, reason)))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [choice for _, _, choice in scored]
