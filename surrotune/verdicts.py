"""Verdicts reached after a trial was told: sanitizer findings and re-measured times.

Optuna freezes a finished trial: neither its state nor its user attributes can change
(``UpdateFinishedTrialError``, in every storage). What surrotune learns about a trial after the
search (compute-sanitizer found a race in the winner; the top configurations were timed again)
is therefore stored as *study* user attributes, one key per trial, named ``<what>.<trial
number>``. One key per trial rather than one dict for the study, so that several runners
finishing the same study never overwrite each other's verdicts.

A sanitizer finding *demotes* a COMPLETE trial: it stays COMPLETE with its value (Optuna's own
``study.best_trial`` still returns it), but surrotune reads its status as the finding's
(``runtime`` or ``correctness``) wherever it picks a best trial or counts statuses
(:func:`surrotune.runner.read_study`, ``surrotune show``, exports). docs/trials.md documents the
keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna

from surrotune.result import Status

__all__ = [
    "COUNTERS_PREFIX",
    "REMEASURED_PREFIX",
    "REMEASURE_ATTR",
    "SANITIZER_PREFIX",
    "VERDICT_ATTRS",
    "demoted_trials",
    "profiled_trial_counters",
    "ranked_ok_trials",
    "set_trial_verdict",
    "trial_verdicts",
]

#: study attribute ``sanitizer.<number>``: compute-sanitizer's verdict on that trial
SANITIZER_PREFIX = "sanitizer."
#: study attribute ``remeasured_ms.<number>``: that trial's re-measured times, one per round
REMEASURED_PREFIX = "remeasured_ms."
#: study attribute ``counters.<number>``: that trial's hardware counters and their diagnosis
COUNTERS_PREFIX = "counters."
#: study attribute ``remeasure``: the last re-measurement of the top configurations, as a whole
REMEASURE_ATTR = "remeasure"

#: study-attribute name -> what it holds (documented in docs/trials.md, "Study attributes")
VERDICT_ATTRS: dict[str, str] = {
    "sanitizer.<trial>": (
        "compute-sanitizer's verdict on the trial: outcome (clean or finding), status (the "
        "demotion: runtime for memcheck, correctness for racecheck), tool, summary, reports"
    ),
    "remeasured_ms.<trial>": "the trial's times when measured again, ms, one per round",
    "counters.<trial>": (
        "the trial's Nsight Compute counters (by name, docs/counters.md), their diagnosis "
        "(label, labels, summary) and why the trial was profiled (elite, failure, all)"
    ),
    "remeasure": (
        "the last re-measurement of the top configurations: trials, rounds, verdict on the "
        "winner (held, held within noise, did not hold), fastest, difference, tolerance"
    ),
}


def set_trial_verdict(study: optuna.Study, prefix: str, number: int, value: Any) -> None:
    """Store ``value`` as the study attribute ``<prefix><number>`` (JSON-serialisable)."""
    study.set_user_attr(f"{prefix}{number}", value)


def trial_verdicts(source: optuna.Study | Mapping[str, Any], prefix: str) -> dict[int, Any]:
    """Every ``<prefix><number>`` study attribute, by trial number."""
    attrs = source.user_attrs if isinstance(source, optuna.Study) else source
    verdicts: dict[int, Any] = {}
    for key, value in attrs.items():
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            verdicts[int(key[len(prefix) :])] = value
    return verdicts


def demoted_trials(source: optuna.Study | Mapping[str, Any]) -> dict[int, Status]:
    """Trial number -> the status a sanitizer finding gave it, for every demoted trial.

    Accepts the study or its ``user_attrs`` (read once by a caller that needs them anyway).
    """
    demoted: dict[int, Status] = {}
    for number, verdict in trial_verdicts(source, SANITIZER_PREFIX).items():
        if not isinstance(verdict, Mapping) or verdict.get("outcome") != "finding":
            continue
        try:
            demoted[number] = Status(verdict.get("status", Status.RUNTIME.value))
        except ValueError:
            demoted[number] = Status.RUNTIME
    return demoted


def profiled_trial_counters(
    source: optuna.Study | Mapping[str, Any],
) -> dict[int, Mapping[str, float]]:
    """Trial number -> the counters its profile stored (the ``counters`` of each
    ``counters.<number>`` study attribute that holds any): what Nsight Compute read on that
    trial's configuration after the search."""
    found: dict[int, Mapping[str, float]] = {}
    for number, verdict in trial_verdicts(source, COUNTERS_PREFIX).items():
        counters = verdict.get("counters") if isinstance(verdict, Mapping) else None
        if isinstance(counters, Mapping) and counters:
            found[number] = counters
    return found


def ranked_ok_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's ``ok`` measurements, best first: COMPLETE, with a finite value, status ``ok``,
    neither a ``duplicate_of`` another nor interrupted, and not demoted.

    The candidates of the end-of-run checks (sanitizer, re-measurement); ties go to the
    earlier trial, as in :func:`surrotune.runner.read_study`.
    """
    demoted = demoted_trials(study)
    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.value is not None
        and math.isfinite(t.value)
        and t.user_attrs.get("status") == Status.OK.value
        and "duplicate_of" not in t.user_attrs
        and not t.user_attrs.get("interrupted")
        and t.number not in demoted
    ]
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    trials.sort(key=lambda t: (sign * float(t.value or 0.0), t.number))
    return trials
