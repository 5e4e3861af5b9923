"""Exports of a stored study. For now: a surrotune recording (the replay backend's own format).

A brute-force study of a live GPU becomes, through :func:`export_recording`, a dataset that
replays anywhere: the shipped ``experiments/datasets/*_h200.json.gz`` files are made this way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna

from surrotune.backends.replay import save_recording
from surrotune.errors import SurrotuneError
from surrotune.result import Result
from surrotune.runner import is_measurement
from surrotune.verdicts import SANITIZER_PREFIX, demoted_trials, trial_verdicts

__all__ = ["STUDY_ATTR", "ExportError", "export_recording", "study_results"]

#: the study user attribute in which `surrotune run` records what the study is
STUDY_ATTR = "surrotune"


class ExportError(SurrotuneError, ValueError):
    """A study that cannot be exported (not made by surrotune, nothing measured)."""


def study_results(study: optuna.Study) -> list[Result]:
    """Every measured configuration of the study once, as Results, in trial order.

    Left out: duplicates (answered from the study), interrupted trials and ``constraint``
    proposals (never compiled: they are not part of a recording's feasible space).
    """
    results = []
    seen: set[str] = set()
    verdicts = trial_verdicts(study.user_attrs, SANITIZER_PREFIX)
    demoted = demoted_trials(study.user_attrs)  # a sanitizer finding: exported with its status
    for trial in study.get_trials(deepcopy=False):
        if not is_measurement(trial):
            continue
        attrs = trial.user_attrs
        key = attrs.get("config_key") or repr(sorted(trial.params.items()))
        if key in seen:
            continue
        seen.add(key)
        if trial.number in demoted:
            summary = verdicts[trial.number].get("summary", "compute-sanitizer finding")
            attrs = {**attrs, "status": demoted[trial.number].value, "error": summary}
        results.append(Result.from_user_attrs(trial.params, attrs))
    return results


def _relative(file: str | None, recording: str | Path) -> str | None:
    if not file:
        return file
    return os.path.relpath(file, Path(recording).resolve().parent)


def export_recording(study: optuna.Study, path: str | Path) -> int:
    """Write ``study`` as a surrotune recording; returns the number of configurations."""
    described: dict[str, Any] | None = study.user_attrs.get(STUDY_ATTR)
    if described is None:
        raise ExportError(f"study {study.study_name!r} was not written by surrotune run")
    results = study_results(study)
    if not results:
        raise ExportError(f"study {study.study_name!r} holds no measured configuration")
    kernel = described.get("kernel") or {}
    device = dict(study.user_attrs.get("device") or {})
    experiment = described.get("experiment")
    if experiment:  # relative to the recording, so that no machine's home folder is shipped
        experiment = os.path.relpath(experiment, Path(path).resolve().parent)
    kernel = {**kernel, "template": _relative(kernel.get("template"), path)}
    metadata = {
        "study": study.study_name,
        "experiment": experiment,
        "backend": described.get("backend"),
        "kernel": kernel,
        "objective_metric": described.get("objective"),
    }
    save_recording(
        path,
        results,
        parameters=described["parameters"],
        kernel_name=kernel.get("name", study.study_name),
        device=device,
        problem_size=described.get("sizes") or {},
        objective="time" if described.get("objective") == "time" else described["objective"],
        direction=described["direction"],
        constraints=described.get("constraints") or [],
        metadata=metadata,
    )
    return len(results)
