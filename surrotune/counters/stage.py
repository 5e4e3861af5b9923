"""Profiling as a stage of a run: choose, profile within the budget, store, summarise.

The chosen trials (:class:`~surrotune.counters.policy.CountersPolicy`) are profiled in batches,
one ncu process each (:class:`~surrotune.counters.profiler.NcuProfiler`). The first batch is
small, to measure what one configuration costs; the next ones are sized to what is left of the
budget (a share of the run's wall time). Each profiled trial's counters, diagnosis and the
reason it was chosen are stored as the study attribute ``counters.<trial number>``: a finished
trial cannot be changed (see :mod:`surrotune.verdicts`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import optuna

from surrotune.counters.diagnosis import diagnose
from surrotune.counters.policy import CountersPolicy
from surrotune.counters.profiler import ProfileBatch, counters_attrs
from surrotune.result import ParamValue
from surrotune.verdicts import COUNTERS_PREFIX, set_trial_verdict, trial_verdicts

__all__ = ["FIRST_BATCH", "Profiles", "profile_study", "profiled_counters"]

#: configurations in the first batch, whose cost sizes the others
FIRST_BATCH = 4
#: the largest batch (one ncu process): a crash in the target loses at most this many
MAX_BATCH = 64


class Profiles(Protocol):
    """What :func:`profile_study` needs of a profiler (:class:`NcuProfiler` or a fake)."""

    disabled: str

    def profile(self, configs: list[dict[str, ParamValue]]) -> ProfileBatch: ...


def profiled_counters(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """Every stored profile of the study, by trial number."""
    return trial_verdicts(study.user_attrs, COUNTERS_PREFIX)


def profile_study(
    study: optuna.Study,
    profiler: Profiles,
    policy: CountersPolicy,
    *,
    run_wall_s: float,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Profile what ``policy`` chooses among ``study``'s trials; the summary's lines."""
    if profiler.disabled:
        return [f"Counters are off: {profiler.disabled.removeprefix('counters are off: ')}"]
    minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
    already = set(profiled_counters(study))
    choices = policy.choose(study.get_trials(deepcopy=False), minimize=minimize, already=already)
    if not choices:
        return []
    budget_s = policy.budget_share * max(run_wall_s, 0.0)
    spent, cost, profiled, errors = 0.0, None, 0, []
    labels: Counter[str] = Counter()
    started = time.monotonic()
    while choices:
        size = FIRST_BATCH if cost is None else math.floor((budget_s - spent) / cost)
        size = min(size, MAX_BATCH, len(choices))
        if size <= 0 or (cost is not None and spent >= budget_s):
            break
        chunk, choices = choices[:size], choices[size:]
        if log is not None:
            log(f"profiling {len(chunk)} configurations with ncu ({chunk[0].reason}, ...)")
        batch = profiler.profile([dict(c.config) for c in chunk])
        spent += batch.seconds
        if batch.error:
            errors.append(batch.error)
        choices = [chunk[i] for i in batch.not_launched()] + choices  # tried in the next run
        for choice, counters in zip(chunk, batch.counters, strict=True):
            if counters is None:
                continue
            found = diagnose(counters)
            labels[found.label or "unreadable"] += 1
            set_trial_verdict(
                study,
                COUNTERS_PREFIX,
                choice.number,
                {"counters": counters_attrs(counters), "diagnosis": found.to_attrs(),
                 "reason": choice.reason},
            )  # fmt: skip
            profiled += 1
        if batch.seconds_per_config is not None:
            cost = max(batch.seconds_per_config, 1e-3)
        if profiler.disabled:
            break
    lines = []
    wall = time.monotonic() - started
    if profiled:
        each = f", {spent / profiled:.1f} s each" if profiled else ""
        found_text = ", ".join(f"{label} {n}" for label, n in labels.most_common())
        lines.append(
            f"Counters: {profiled} configurations profiled with ncu ({policy.mode}) in {wall:.0f} "
            f"s{each}: {found_text}"
        )
    if profiler.disabled:
        lines.append(f"Counters are off: {profiler.disabled.removeprefix('counters are off: ')}")
    elif errors and not profiled:
        lines.append(f"Counters: ncu gave nothing ({errors[-1]})")
    return lines
