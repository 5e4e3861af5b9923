"""Every trial as a table file (CSV or Parquet), and such a file read back and replayed.

The table is :func:`surrotune.analysis.trials.read_study_trials`'s frame, written by pandas: one
row per trial (constraint proposals, duplicates and interrupted trials included, ``measured``
tells them apart), every user attribute a column, each hardware counter a column
(``counters.<metric>``), parameters as ``params_<name>``. Lists and mappings (``times_ms``,
``device_limits`` ...) are JSON text in a CSV cell; Parquet keeps the lists of numbers as lists
and its schema metadata keeps the study's description (the parameters' value lists in their
order, the objective, the direction), so a Parquet file replays exactly; a CSV file replays
with each parameter's values as the sorted distinct values it holds.

:func:`read_table` gives the frame back with those columns decoded; :func:`table_dataset` turns
its measurements into a :class:`surrotune.backends.replay.Dataset` that the replay backend
answers from, which closes the loop: export, replay, the same best configuration.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from surrotune.analysis.trials import COUNTER_PREFIX, PARAM_PREFIX, AnalysisError, StudyTrials
from surrotune.backends.replay import Dataset
from surrotune.result import USER_ATTRS, Result

__all__ = ["TABLE_FORMATS", "read_table", "table_dataset", "write_table"]

TABLE_FORMATS = ("csv", "parquet")
#: the frame's ``attrs`` key (and Parquet metadata) holding the study's description
_META = "surrotune"
#: columns whose cells are lists of numbers
_LISTS = ("times_ms", "remeasured_ms")


def _json_cell(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    return value


def _prepared(study: StudyTrials, fmt: str) -> pd.DataFrame:
    frame = study.frame.copy()
    for column in frame.columns:
        values = frame[column]
        if values.dtype != object:
            continue
        nested = values.map(lambda v: isinstance(v, list | tuple | dict | np.ndarray))
        if not nested.any():
            continue
        if fmt == "parquet" and column in _LISTS:
            frame[column] = values.map(lambda v: [float(t) for t in v] if v is not None else None)
        else:
            frame[column] = values.map(_json_cell)
    frame.attrs[_META] = {
        "study": study.name,
        "direction": study.direction,
        "objective": study.objective,
        "parameters": study.parameters,
        "device": dict(study.device),
        "kernel": (study.described.get("kernel") or {}).get("name"),
        "sizes": study.described.get("sizes") or {},
        "constraints": list(study.described.get("constraints") or []),
    }
    return frame


def write_table(study: StudyTrials, path: str | Path, fmt: str) -> int:
    """Write every trial of ``study`` as CSV or Parquet; returns the number of rows.

    Raises:
        AnalysisError: an unknown format, no trial, or Parquet without pyarrow.
    """
    if fmt not in TABLE_FORMATS:
        raise AnalysisError(f"table format must be one of {', '.join(TABLE_FORMATS)}; got {fmt!r}")
    if study.frame.empty:
        raise AnalysisError(f"study {study.name!r} holds no trial: nothing to export")
    frame = _prepared(study, fmt)
    path = Path(path)
    if fmt == "csv":
        frame.to_csv(path, index=False)
        return len(frame)
    try:
        frame.to_parquet(path, index=False)
    except ImportError as exc:
        raise AnalysisError(
            f"Parquet needs pyarrow ({exc}): pip install 'surrotune[analysis]'"
        ) from None
    return len(frame)


def _decode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def read_table(path: str | Path) -> pd.DataFrame:
    """A table written by :func:`write_table`, with its lists and mappings decoded.

    Raises:
        AnalysisError: the file is missing, or is neither CSV nor Parquet.
    """
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"{path}: no such file")
    if path.read_bytes()[:4] == b"PAR1":
        try:
            frame = pd.read_parquet(path)
        except ImportError as exc:
            raise AnalysisError(f"reading Parquet needs pyarrow ({exc})") from None
    else:
        try:
            frame = pd.read_csv(path, low_memory=False)
        except (UnicodeDecodeError, pd.errors.ParserError) as exc:
            raise AnalysisError(f"{path}: neither Parquet nor CSV ({exc})") from None
    for column in frame.columns:
        values = frame[column]
        if values.dtype == object or pd.api.types.is_string_dtype(values.dtype):
            frame[column] = values.astype(object).map(_decode)
    if "measured" not in frame or "status" not in frame:
        raise AnalysisError(
            f"{path}: not a surrotune trial table (no 'measured' and 'status' columns); "
            "write one with surrotune export --format csv|parquet"
        )
    return frame


def _plain(value: Any) -> Any:
    """A table cell as a Result field: NaN as None, NumPy scalars as Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _parameter_values(column: pd.Series) -> list[Any]:
    values = [_plain(v) for v in column.dropna().unique()]
    if values and all(isinstance(v, float) and v.is_integer() for v in values):
        values = [int(v) for v in values]  # a CSV column with a gap reads as floats
    try:
        return sorted(values)
    except TypeError:
        return values


def table_dataset(path: str | Path) -> Dataset:
    """The measurements of a trial table as a replayable Dataset (each configuration once)."""
    frame = read_table(path)
    meta: Mapping[str, Any] = frame.attrs.get(_META) or {}
    columns = [c for c in frame.columns if c.startswith(PARAM_PREFIX)]
    if not columns:
        raise AnalysisError(f"{path}: no parameter column ({PARAM_PREFIX}<name>)")
    measured = frame[frame["measured"].astype(str).isin(("True", "true", "1"))]
    parameters: dict[str, list[Any]] = {
        c.removeprefix(PARAM_PREFIX): _parameter_values(measured[c]) for c in columns
    }
    if isinstance(meta.get("parameters"), Mapping):
        parameters = {str(k): list(v) for k, v in meta["parameters"].items()}
    fields = [c for c in USER_ATTRS if c in frame.columns]
    counters = [c for c in frame.columns if c.startswith(COUNTER_PREFIX)]
    results: dict[str, Result] = {}
    objective = str(meta.get("objective") or _first(measured, "objective_metric") or "time")
    direction = str(meta.get("direction") or _first(measured, "direction") or "minimize")
    dataset = Dataset(
        path=Path(path),
        format="surrotune-table",
        kernel_name=str(meta.get("kernel") or _first(measured, "study") or ""),
        device_name=str((meta.get("device") or {}).get("name") or Path(path).stem),
        problem_size=meta.get("sizes") or {},
        parameters=parameters,
        objective=objective,
        direction=direction,
        results=results,
        constraints=tuple(meta.get("constraints") or ()),
        metadata={"device": dict(meta.get("device") or {"name": Path(path).stem})},
    )
    ints = {name for name, values in parameters.items() if all(type(v) is int for v in values)}
    for _, row in measured.iterrows():
        config = {
            name: int(row[PARAM_PREFIX + name])
            if name in ints
            else _plain(row[PARAM_PREFIX + name])
            for name in parameters
        }
        attrs = {c: _plain(row[c]) for c in fields}
        attrs["counters"] = {
            c.removeprefix(COUNTER_PREFIX): float(row[c]) for c in counters if pd.notna(row[c])
        }
        attrs = {k: v for k, v in attrs.items() if v is not None}
        key = dataset.key(config)
        if key not in results:
            results[key] = Result.from_user_attrs(config, attrs)
    return dataset


def _first(frame: pd.DataFrame, column: str) -> Any:
    return frame[column].iloc[0] if column in frame and len(frame) else None
