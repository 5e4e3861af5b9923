"""Exports of a stored study, in the formats other tools read.

``recording``
    surrotune's own recording (:func:`export_recording`), the replay backend's format: a
    brute-force study of a live GPU becomes a dataset that replays anywhere (the shipped
    ``experiments/datasets/*_h200.json.gz`` files are made this way).
``kernel-tuner``
    A Kernel Tuner cache file (:func:`export_kernel_tuner`), in the layout Kernel Tuner 1.x writes
    and reads back in its simulation mode (``tune_kernel(..., cache=FILE, simulation_mode=True)``
    or ``kernel_tuner.interface.tune_cache(FILE)``).
``t4``
    The T4 auto-tuning results format (:func:`export_t4`), valid against Kernel Tuner's own T4
    results schema (``kernel_tuner/schema/T4/1.0.0/results-schema.json``).
``csv``, ``parquet``
    Every trial with every field, one row each (:mod:`surrotune.analysis.table`).

The dataset formats hold each measured configuration once (duplicates, ``constraint`` proposals and
interrupted trials left out) with its effective status: a sanitizer finding exports as the failure
it is. Kernel Tuner knows two failures, so ``compile`` writes ``CompilationFailedConfig`` and every
other failure ``RuntimeFailedConfig`` (which surrotune reads back as ``resource``); T4's
``invalidity`` keeps ``compile``, ``timeout`` and ``correctness`` and writes the other failures as
``runtime``.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from surrotune.backends.replay import save_recording
from surrotune.errors import SurrotuneError
from surrotune.result import Result, Status
from surrotune.runner import is_measurement
from surrotune.verdicts import (
    SANITIZER_PREFIX,
    demoted_trials,
    profiled_trial_counters,
    trial_verdicts,
)

__all__ = [
    "FORMATS",
    "STUDY_ATTR",
    "ExportError",
    "export_kernel_tuner",
    "export_recording",
    "export_study",
    "export_t4",
    "infer_format",
    "measured_trials",
    "study_results",
]

#: the study user attribute in which `surrotune run` records what the study is
STUDY_ATTR = "surrotune"
#: every format ``surrotune export --format`` writes
FORMATS = ("recording", "kernel-tuner", "t4", "csv", "parquet")


class ExportError(SurrotuneError, ValueError):
    """A study that cannot be exported (not made by surrotune, nothing measured)."""


def measured_trials(study: optuna.Study) -> list[tuple[FrozenTrial, Result]]:
    """Every measured configuration of the study once, with the trial that measured it, in trial
    order; a demoted trial's Result carries the sanitizer's status and summary.

    Left out: duplicates (answered from the study), interrupted trials and ``constraint``
    proposals (never compiled: they are not part of a recording's feasible space). A trial
    profiled at the end of its run (``counters.<trial>`` study attributes) carries those
    counters, as :func:`surrotune.surrogate.counter_model.trial_counters` reads them.
    """
    pairs = []
    seen: set[str] = set()
    verdicts = trial_verdicts(study.user_attrs, SANITIZER_PREFIX)
    profiled = profiled_trial_counters(study.user_attrs)
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
        if trial.number in profiled:
            attrs = {**attrs, "counters": dict(profiled[trial.number])}
        pairs.append((trial, Result.from_user_attrs(trial.params, attrs)))
    return pairs


def study_results(study: optuna.Study) -> list[Result]:
    """Every measured configuration of the study once, as Results, in trial order
    (:func:`measured_trials` without the trials)."""
    return [result for _, result in measured_trials(study)]


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


# --------------------------------------------------------------------------- other tools' formats


def _described(study: optuna.Study) -> Mapping[str, Any]:
    described = study.user_attrs.get(STUDY_ATTR)
    if not isinstance(described, Mapping):
        raise ExportError(f"study {study.study_name!r} was not written by surrotune run")
    return described


def _measured(study: optuna.Study) -> list[tuple[FrozenTrial, Result]]:
    pairs = measured_trials(study)
    if not pairs:
        raise ExportError(f"study {study.study_name!r} holds no measured configuration")
    return pairs


def _kernel_name(study: optuna.Study, described: Mapping[str, Any]) -> str:
    return str((described.get("kernel") or {}).get("name") or study.study_name)


def _device_name(study: optuna.Study) -> str:
    return str((study.user_attrs.get("device") or {}).get("name") or "unknown")


def _problem_size(described: Mapping[str, Any]) -> list[Any]:
    """Kernel Tuner's problem size: the experiment's sizes, in order (``[1]`` when it has none;
    Kernel Tuner only compares it with the one a simulation asks for)."""
    sizes = described.get("sizes") or {}
    return list(sizes.values()) if sizes else [1]


def _timestamp(trial: FrozenTrial) -> str | None:
    when = trial.datetime_complete or trial.datetime_start
    return when.isoformat() if when is not None else None


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """One JSON document, gzipped when the name ends in ``.gz`` (surrotune reads both; Kernel
    Tuner reads only plain ``.json``)."""
    data = json.dumps(doc, indent=None, default=str).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


#: surrotune status -> Kernel Tuner's failure marker
_KT_MARKERS: dict[Status, str] = {Status.COMPILE: "CompilationFailedConfig"}


def export_kernel_tuner(study: optuna.Study, path: str | Path) -> int:
    """Write the study as a Kernel Tuner cache file; returns the number of configurations.

    Each entry holds the parameters, the objective (``time`` in ms unless the study optimised a
    rate, then that rate and ``time`` beside it), the repeats (``times``), ``compile_time``,
    ``verification_time`` and ``benchmark_time`` in ms where known, ``timestamp`` and, on a
    failure, ``__error__``. Kernel Tuner's simulation mode needs every configuration its
    search space admits in the cache: simulate with restrictions that admit only these (as
    ``kernel_tuner.interface.tune_cache`` infers them).
    """
    described = _described(study)
    pairs = _measured(study)
    names = list(described["parameters"])
    objective = str(described.get("objective") or "time")
    cache: dict[str, dict[str, Any]] = {}
    for trial, result in pairs:
        entry: dict[str, Any] = {name: result.config[name] for name in names}
        if result.ok:
            entry[objective] = result.objective
            if objective != "time" and result.time_ms is not None:
                entry["time"] = result.time_ms
        else:
            entry["__error__"] = _KT_MARKERS.get(result.status, "RuntimeFailedConfig")
        if result.times_ms:
            entry["times"] = list(result.times_ms)
        if result.compile_time_ms is not None:
            entry["compile_time"] = result.compile_time_ms
        if result.benchmark_time_ms is not None:
            entry["verification_time"] = 0.0
            entry["benchmark_time"] = result.benchmark_time_ms
        entry["strategy_time"] = 0.0
        entry["framework_time"] = 0.0
        if result.registers is not None:
            entry["num_regs"] = result.registers
        if (stamp := _timestamp(trial)) is not None:
            entry["timestamp"] = stamp
        cache[result.config_key(names)] = entry
    doc = {
        "device_name": _device_name(study),
        "kernel_name": _kernel_name(study, described),
        "problem_size": _problem_size(described),
        "tune_params_keys": names,
        "tune_params": {name: list(values) for name, values in described["parameters"].items()},
        "objective": objective,
        "cache": cache,
    }
    _write_json(Path(path), doc)
    return len(cache)


#: surrotune status -> T4 ``invalidity``
_T4_INVALIDITY: dict[Status, str] = {
    Status.OK: "correct",
    Status.COMPILE: "compile",
    Status.TIMEOUT: "timeout",
    Status.CORRECTNESS: "correctness",
    Status.CONSTRAINT: "constraints",
}


def export_t4(study: optuna.Study, path: str | Path) -> int:
    """Write the study in the T4 results format; returns the number of configurations.

    As Kernel Tuner writes it (``kernel_tuner.file_utils.get_t4_results``): per configuration its
    ``timestamp``, ``configuration``, ``times`` (``compilation``, ``benchmark``, ``validation``,
    ``runtimes``, in ms), ``invalidity``, ``correctness`` and ``measurements`` (the objective,
    then the resources the trial holds), with ``metadata.timeunit`` ``milliseconds``; the
    metadata also names the device, the kernel and the problem size.
    """
    described = _described(study)
    pairs = _measured(study)
    names = list(described["parameters"])
    objective = str(described.get("objective") or "time")
    unit = "ms" if objective == "time" else objective
    rows = []
    for trial, result in pairs:
        measurements = []
        if result.ok:
            measurements.append({"name": objective, "value": result.objective, "unit": unit})
        for name, what in (
            ("time_ms", "ms"), ("registers", ""), ("shared_bytes", "B"), ("local_bytes", "B"),
            ("occupancy", ""), ("verification_error", ""),
        ):  # fmt: skip
            value = getattr(result, name)
            if value is not None and not (name == "time_ms" and objective == "time"):
                measurements.append({"name": name, "value": value, "unit": what})
        measurements.extend(
            {"name": metric, "value": value, "unit": ""}
            for metric, value in result.counters.items()
        )
        row: dict[str, Any] = {
            "configuration": {name: result.config[name] for name in names},
            "times": {
                "compilation": result.compile_time_ms or 0.0,
                "benchmark": result.benchmark_time_ms or 0.0,
                "framework": 0.0,
                "search_algorithm": 0.0,
                "validation": 0.0,
                "runtimes": list(result.times_ms),
            },
            "invalidity": _T4_INVALIDITY.get(result.status, "runtime"),
            "correctness": 0 if result.status is Status.CORRECTNESS else 1,
            "measurements": measurements,
            "objectives": [objective],
        }
        if (stamp := _timestamp(trial)) is not None:
            row = {"timestamp": stamp, **row}
        rows.append(row)
    doc = {
        "schema_version": "1.0.0",
        "metadata": {
            "timeunit": "milliseconds",
            "device_name": _device_name(study),
            "kernel_name": _kernel_name(study, described),
            "problem_size": described.get("sizes") or {},
            "study": study.study_name,
        },
        "results": rows,
    }
    _write_json(Path(path), doc)
    return len(rows)


def infer_format(path: str | Path) -> str:
    """The export format a file name implies: ``.csv``, ``.parquet`` (or ``.pq``), else a
    surrotune recording (``.json``, ``.json.gz``)."""
    name = Path(path).name.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return "recording"


def export_study(study: optuna.Study, path: str | Path, fmt: str | None = None) -> int:
    """Write ``study`` to ``path`` in ``fmt`` (inferred from the name when None); returns the
    number of configurations (dataset formats) or of trials (tables) written."""
    fmt = fmt or infer_format(path)
    if fmt == "recording":
        return export_recording(study, path)
    if fmt == "kernel-tuner":
        return export_kernel_tuner(study, path)
    if fmt == "t4":
        return export_t4(study, path)
    if fmt in ("csv", "parquet"):
        from surrotune.analysis.table import write_table
        from surrotune.analysis.trials import read_study_trials

        return write_table(read_study_trials(study), path, fmt)
    raise ExportError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
