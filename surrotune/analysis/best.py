"""``surrotune best``: the winner of a study, as JSON or as a C header to compile into a build.

The winner is the best ``ok`` measurement as surrotune ranks it
(:func:`surrotune.verdicts.ranked_ok_trials`): a trial that compute-sanitizer found wrong after
the search is *demoted* and is not the winner, even though Optuna's ``study.best_trial`` still
returns it; duplicates and interrupted trials are not candidates either.

The header holds one ``#define NAME value`` per parameter, the way the kernel template's
``${NAME}`` placeholders were filled when the winner was measured: numbers as written, booleans
as ``1``/``0``, strings as their text (``#define DTYPE float``), behind an include guard and a
comment that says which study, trial, objective and device it comes from. A ``prefix`` avoids
clashes with the user's own macros (``--prefix GEMM_`` gives ``GEMM_BLOCK_M``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping
from typing import Any

import optuna

from surrotune.analysis.export import STUDY_ATTR
from surrotune.analysis.trials import AnalysisError
from surrotune.storage import describe_storage
from surrotune.verdicts import (
    REMEASURE_ATTR,
    SANITIZER_PREFIX,
    demoted_trials,
    ranked_ok_trials,
    trial_verdicts,
)

__all__ = ["BEST_FORMATS", "best_configuration", "format_best", "format_header"]

BEST_FORMATS = ("json", "header")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: user attributes copied into the JSON when the trial holds them
_FIELDS = (
    "time_ms",
    "registers",
    "shared_bytes",
    "local_bytes",
    "threads_per_block",
    "occupancy",
    "active_blocks_per_sm",
    "occupancy_limiter",
    "timing_precision",
    "compile_time_ms",
)


def best_configuration(study: optuna.Study, storage: str = "") -> dict[str, Any]:
    """The study's winner as a JSON-ready mapping.

    Raises:
        AnalysisError: the study was not written by surrotune, or has no ok measurement (the
            message gives the counts by status).
    """
    described = study.user_attrs.get(STUDY_ATTR)
    if not isinstance(described, Mapping):
        raise AnalysisError(f"study {study.study_name!r} was not written by surrotune run")
    ranked = ranked_ok_trials(study)
    demoted = demoted_trials(study)
    if not ranked:
        counts: dict[str, int] = {}
        for trial in study.get_trials(deepcopy=False):
            status = demoted.get(trial.number) or trial.user_attrs.get("status")
            if status is not None and "duplicate_of" not in trial.user_attrs:
                counts[str(status)] = counts.get(str(status), 0) + 1
        found = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no trial"
        raise AnalysisError(
            f"study {study.study_name!r} has no ok configuration ({found}): there is no "
            "winner to write"
        )
    trial = ranked[0]
    objective = str(described.get("objective") or "time")
    direction = str(described.get("direction") or "minimize")
    attrs = trial.user_attrs
    times = [float(t) for t in attrs.get("times_ms") or []]
    kernel = described.get("kernel") or {}
    winner: dict[str, Any] = {
        "study": study.study_name,
        "storage": describe_storage(storage) if storage else "",
        "trial": trial.number,
        "params": dict(trial.params),
        "objective": {
            "metric": objective,
            "value": trial.value,
            "unit": "ms" if objective == "time" else objective,
            "direction": direction,
        },
        "kernel": kernel.get("name"),
        "device": (study.user_attrs.get("device") or {}).get("name"),
        "measured_at": trial.datetime_complete.isoformat() if trial.datetime_complete else None,
        "repeats": len(times),
        "spread_pct": 100 * statistics.stdev(times) / statistics.mean(times)
        if len(times) > 1
        else None,
        **{name: attrs[name] for name in _FIELDS if attrs.get(name) is not None},
        "ok_trials": len(ranked),
    }
    sanitizer = trial_verdicts(study, SANITIZER_PREFIX).get(trial.number)
    if sanitizer is not None:
        winner["sanitizer"] = sanitizer.get("outcome") if isinstance(sanitizer, Mapping) else None
    if demoted:
        winner["demoted_trials"] = sorted(demoted)
    remeasure = study.user_attrs.get(REMEASURE_ATTR)
    if isinstance(remeasure, Mapping):
        winner["remeasure_verdict"] = remeasure.get("verdict")
    return winner


def _macro_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise AnalysisError(f"parameter {name} = {value!r} has no C spelling")
        return repr(value)
    text = str(value)
    if "\n" in text or "*/" in text or "//" in text:
        raise AnalysisError(f"parameter {name} = {text!r} cannot be a one-line #define")
    return text


def _guard(study: str, prefix: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{prefix}SURROTUNE_{study}_BEST_H").strip("_")
    return slug.upper() if slug[:1].isalpha() or slug[:1] == "_" else f"_{slug.upper()}"


def format_header(winner: Mapping[str, Any], *, prefix: str = "") -> str:
    """The winner as a C/C++/CUDA header of ``#define`` lines.

    Raises:
        AnalysisError: a parameter name (with the prefix) is not a C identifier, or a value
            cannot be written on one line.
    """
    objective = winner["objective"]
    lines = [
        "/* Best configuration found by surrotune (surrotune best --format header).",
        f" * study '{winner['study']}'"
        + (f" in {winner['storage']}" if winner.get("storage") else "")
        + f", trial {winner['trial']} (best of {winner['ok_trials']} ok configurations)",
    ]
    if winner.get("kernel"):
        lines.append(f" * kernel {winner['kernel']} on {winner.get('device') or 'an unnamed GPU'}")
    elif winner.get("device"):
        lines.append(f" * measured on {winner['device']}")
    spread = winner.get("spread_pct")
    lines.append(
        f" * objective {objective['metric']}: {objective['value']:.6g} {objective['unit']} "
        f"({objective['direction']})"
        + (f", {winner['repeats']} repeats, spread {spread:.2f} %" if spread is not None else "")
    )
    if winner.get("measured_at"):
        lines.append(f" * measured {winner['measured_at']}")
    lines.append(" */")
    guard = _guard(str(winner["study"]), prefix)
    lines += [f"#ifndef {guard}", f"#define {guard}", ""]
    for name, value in winner["params"].items():
        macro = f"{prefix}{name}"
        if not _IDENTIFIER.fullmatch(macro):
            raise AnalysisError(
                f"parameter {name!r} gives the macro name {macro!r}, which is not a C "
                "identifier; pass --prefix to make one"
            )
        lines.append(f"#define {macro} {_macro_value(name, value)}")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def format_best(winner: Mapping[str, Any], fmt: str, *, prefix: str = "") -> str:
    """The winner in ``fmt`` (``json`` or ``header``), as text ending in a newline."""
    if fmt == "json":
        return json.dumps(winner, indent=2, default=str) + "\n"
    if fmt == "header":
        return format_header(winner, prefix=prefix)
    raise AnalysisError(f"--format must be one of {', '.join(BEST_FORMATS)}; got {fmt!r}")
