"""A stored study as one table: every trial, every field, read once, offline.

Every analysis (report, exports, ``surrotune best``) starts here, so that they all agree on what a
trial is: its *effective* status (a sanitizer finding demotes a COMPLETE trial, see
:mod:`surrotune.verdicts`), whether it is a measurement (:func:`surrotune.runner.is_measurement`:
not a ``constraint`` proposal, not a ``duplicate_of`` another trial, not interrupted) and the
ranking of the ``ok`` measurements (the order :func:`surrotune.verdicts.ranked_ok_trials` gives).

The table follows the column names of Optuna's ``study.trials_dataframe()`` where they overlap
(``number``, ``value``, ``datetime_start``, ``datetime_complete``, ``state``, ``params_<name>``),
so that it reads like the table Optuna users know; the user attributes of docs/trials.md are plain
columns (``status``, ``time_ms``, ``registers`` ...), the hardware counters one column each
(``counters.<metric>``), and a few derived columns say what surrotune made of each trial
(:data:`DERIVED_COLUMNS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from surrotune.errors import SurrotuneError
from surrotune.result import USER_ATTRS, Status
from surrotune.runner import RUNNER_ATTRS, is_measurement
from surrotune.storage import describe_storage, storage_url
from surrotune.verdicts import (
    REMEASURE_ATTR,
    REMEASURED_PREFIX,
    SANITIZER_PREFIX,
    demoted_trials,
    trial_verdicts,
)

__all__ = [
    "COUNTER_PREFIX",
    "DERIVED_COLUMNS",
    "PARAM_PREFIX",
    "AnalysisError",
    "StudyTrials",
    "open_studies",
    "open_study",
    "read_study_trials",
    "remeasure_report",
]

#: the column prefix of a parameter (Optuna's ``trials_dataframe`` convention)
PARAM_PREFIX = "params_"
#: the column prefix of a hardware counter
COUNTER_PREFIX = "counters."
#: the system attribute in which a worker marks the trials it asked (docs/distributed.md)
_WORKER_ATTR = "surrotune:worker"

#: columns the table adds beside the trial's own fields, with what they hold
DERIVED_COLUMNS: dict[str, str] = {
    "study": "the study's name (so that the tables of several studies concatenate)",
    "number": "the trial number",
    "state": "Optuna's trial state: COMPLETE, FAIL, RUNNING, WAITING or PRUNED",
    "value": "the trial's value (the objective of an ok trial; empty otherwise)",
    "measured": "whether the trial is one evaluation of a configuration (docs/trials.md)",
    "demoted": "the status a sanitizer finding gave this COMPLETE trial; empty when none",
    "sanitizer": "compute-sanitizer's outcome on the trial (clean, finding), when it ran",
    "remeasured_ms": "the trial's times when measured again after the search, ms",
    "worker": "the worker that asked the trial (several workers on one study)",
    "datetime_start": "when the trial started (UTC)",
    "datetime_complete": "when the trial finished (UTC)",
    "duration_s": "datetime_complete - datetime_start, seconds",
    "elapsed_s": "seconds from the study's first trial start to this trial's end",
    "direction": "the study's direction: minimize or maximize",
    "objective_metric": "the objective's name: time (ms), GFLOP/s, GB/s ...",
}


class AnalysisError(SurrotuneError, ValueError):
    """A storage or study that cannot be analysed: names what is missing and what exists."""


def open_study(storage: str, study_name: str | None = None) -> optuna.Study:
    """Open an existing study, refusing to create anything.

    ``storage`` is a path (``.db`` SQLite, ``.log`` journal) or a URL. Opening a missing SQLite
    or journal file would create an empty one, so a missing file is an error, as is an unknown
    study name, or no name when the storage holds several.
    """
    if study_name:
        return open_studies(storage, [study_name])[0]
    studies = open_studies(storage)
    if len(studies) > 1:
        raise AnalysisError(
            f"{describe_storage(storage)} holds {len(studies)} studies; choose one with "
            f"--study: {', '.join(s.study_name for s in studies)}"
        )
    return studies[0]


def open_studies(storage: str, names: Sequence[str] | None = None) -> list[optuna.Study]:
    """The named studies of ``storage`` (every study it holds when ``names`` is None)."""
    from surrotune.storage import StorageError, open_storage

    url = storage_url(storage)
    for scheme in ("sqlite:///", "journal:///"):
        if url.startswith(scheme) and not Path(url.removeprefix(scheme)).is_file():
            raise AnalysisError(f"{storage}: no such storage file")
    try:
        opened = open_storage(storage)
        held = [s.study_name for s in optuna.get_all_study_summaries(opened)]
    except (StorageError, optuna.exceptions.StorageInternalError) as exc:
        raise AnalysisError(f"{storage}: cannot open the storage ({exc})") from None
    if not held:
        raise AnalysisError(f"{describe_storage(storage)} holds no study")
    wanted = list(names) if names else held
    unknown = [n for n in wanted if n not in held]
    if unknown:
        raise AnalysisError(
            f"{describe_storage(storage)} has no study {', '.join(map(repr, unknown))}; "
            f"it has: {', '.join(held)}"
        )
    return [optuna.load_study(study_name=name, storage=opened) for name in wanted]


@dataclass(frozen=True)
class StudyTrials:
    """One study read back: what it is, and every trial as a row of :attr:`frame`.

    ``parameters`` keeps the study's own value lists and their order (the ``surrotune`` study
    attribute); ``frame`` holds one row per trial in trial order, including the proposals that
    broke a constraint, duplicates and interrupted trials (``measured`` tells them apart).
    """

    name: str
    storage: str
    direction: str
    objective: str
    parameters: dict[str, list[Any]]
    frame: pd.DataFrame
    device: Mapping[str, Any] = field(default_factory=dict)
    described: Mapping[str, Any] = field(default_factory=dict)
    user_attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        """The objective's unit: ms for ``time``, else the metric's own name (GFLOP/s ...)."""
        return "ms" if self.objective == "time" else self.objective

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    @property
    def kernel(self) -> str:
        """The kernel's name; empty for a replayed recording that does not name it."""
        kernel = self.described.get("kernel") or {}
        return str(kernel.get("name") or "")

    @property
    def tuned(self) -> list[str]:
        """The parameters that take more than one value (the others are fixed)."""
        return [name for name, values in self.parameters.items() if len(values) > 1]

    @property
    def device_name(self) -> str:
        return str(self.device.get("name") or "unknown device")

    @property
    def backend(self) -> str:
        return str(self.described.get("backend") or "")

    def column(self, parameter: str) -> str:
        """The frame's column of a parameter."""
        return PARAM_PREFIX + parameter

    @property
    def measured(self) -> pd.DataFrame:
        """The measurements, in trial order (one per configuration, each counted once)."""
        return self.frame[self.frame["measured"]]

    @property
    def ranked(self) -> pd.DataFrame:
        """The ``ok`` measurements with a finite value, best first; ties to the earlier trial."""
        ok = self.measured
        ok = ok[(ok["status"] == Status.OK.value) & np.isfinite(ok["value"].astype(float))]
        key = -ok["value"] if self.maximize else ok["value"]
        order = np.lexsort((ok["number"].to_numpy(), key.to_numpy(dtype=float)))
        return ok.iloc[order]

    @property
    def best(self) -> pd.Series | None:
        ranked = self.ranked
        return ranked.iloc[0] if len(ranked) else None

    def configs(self, rows: pd.DataFrame | None = None) -> pd.DataFrame:
        """The parameter columns of ``rows`` (default: the measurements) under their own names."""
        rows = self.measured if rows is None else rows
        columns = {self.column(name): name for name in self.parameters}
        return rows[list(columns)].rename(columns=columns)

    def config_text(self, row: pd.Series) -> str:
        """``NAME=value ...`` of the tuned parameters (every parameter when none varies)."""
        names = self.tuned or list(self.parameters)
        return " ".join(f"{name}={row[self.column(name)]}" for name in names)

    def counters(self) -> list[str]:
        """The counter columns present, in name order."""
        return sorted(c for c in self.frame.columns if c.startswith(COUNTER_PREFIX))

    def status_counts(self) -> pd.Series:
        """Measurements by effective status, in the taxonomy's order."""
        counts = self.measured["status"].value_counts()
        order = [s.value for s in Status if s.value in counts.index]
        return counts.reindex(order + sorted(set(counts.index) - set(order)))


def _finite(value: Any) -> Any:
    """NaN and infinities as None: a table cell that is unknown, not a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _row(
    trial: FrozenTrial,
    parameters: Sequence[str],
    demoted: Mapping[int, Status],
    sanitizer: Mapping[int, Any],
    remeasured: Mapping[int, Any],
) -> dict[str, Any]:
    attrs = dict(trial.user_attrs)
    counters = attrs.pop("counters", None) or {}
    status = attrs.pop("status", None)
    if trial.number in demoted:
        status = demoted[trial.number].value
    verdict = sanitizer.get(trial.number)
    start, end = trial.datetime_start, trial.datetime_complete
    row: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state.name,
        "status": status,
        "value": _finite(trial.value) if trial.value is not None else None,
        **{PARAM_PREFIX + name: trial.params.get(name) for name in parameters},
        **{PARAM_PREFIX + k: v for k, v in trial.params.items() if k not in parameters},
        "measured": is_measurement(trial),
        "demoted": demoted[trial.number].value if trial.number in demoted else "",
        "sanitizer": verdict.get("outcome", "") if isinstance(verdict, Mapping) else "",
        "remeasured_ms": list(remeasured.get(trial.number) or []),
        "worker": trial.system_attrs.get(_WORKER_ATTR, ""),
        "datetime_start": start,
        "datetime_complete": end,
        "duration_s": (end - start).total_seconds() if start and end else None,
    }
    row.update({name: attrs.pop(name, None) for name in (*USER_ATTRS, *RUNNER_ATTRS)})
    row.pop("counters", None)
    row["status"] = status
    row.update(sorted(attrs.items()))  # attributes this version does not know: kept as they are
    row.update({COUNTER_PREFIX + k: v for k, v in counters.items()})
    return row


def read_study_trials(study: optuna.Study, storage: str = "") -> StudyTrials:
    """Read every trial of a study that ``surrotune run`` wrote into a :class:`StudyTrials`.

    Raises:
        AnalysisError: the study was not written by surrotune (its trials carry no status).
    """
    from surrotune.analysis.export import STUDY_ATTR

    user_attrs = dict(study.user_attrs)
    described = user_attrs.get(STUDY_ATTR)
    if not isinstance(described, Mapping):
        raise AnalysisError(
            f"study {study.study_name!r} was not written by surrotune run (it lacks the "
            f"{STUDY_ATTR!r} study attribute that says what was tuned)"
        )
    parameters = {str(k): list(v) for k, v in (described.get("parameters") or {}).items()}
    trials = study.get_trials(deepcopy=False)
    demoted = demoted_trials(user_attrs)
    sanitizer = trial_verdicts(user_attrs, SANITIZER_PREFIX)
    remeasured = trial_verdicts(user_attrs, REMEASURED_PREFIX)
    rows = [_row(t, list(parameters), demoted, sanitizer, remeasured) for t in trials]
    frame = pd.DataFrame.from_records(rows)
    for name in (*DERIVED_COLUMNS, *USER_ATTRS, *RUNNER_ATTRS):  # a study without trials too
        if name not in frame and name != "counters":
            frame[name] = pd.Series(dtype=object)
    frame["measured"] = frame["measured"].fillna(False).astype(bool)
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    frame["datetime_start"] = pd.to_datetime(frame["datetime_start"])
    frame["datetime_complete"] = pd.to_datetime(frame["datetime_complete"])
    origin = frame["datetime_start"].min()
    frame["elapsed_s"] = (frame["datetime_complete"] - origin).dt.total_seconds()
    direction = (
        "maximize" if study.direction == optuna.study.StudyDirection.MAXIMIZE else ("minimize")
    )
    objective = str(described.get("objective") or "time")
    frame = frame.drop(columns="study")
    frame.insert(0, "study", study.study_name)
    frame["direction"] = direction
    frame["objective_metric"] = objective
    return StudyTrials(
        name=study.study_name,
        storage=describe_storage(storage) if storage else "",
        direction=direction,
        objective=objective,
        parameters=parameters,
        frame=frame,
        device=dict(user_attrs.get("device") or {}),
        described=dict(described),
        user_attrs=user_attrs,
    )


def remeasure_report(study: StudyTrials) -> Mapping[str, Any] | None:
    """The last re-measurement of the top configurations, as the run stored it."""
    report = study.user_attrs.get(REMEASURE_ATTR)
    return report if isinstance(report, Mapping) else None
