"""Replay: answer configurations from a recorded brute-force dataset instead of a GPU.

Everything but the GPU itself (sampler, runner, analysis, benchmarks of search quality) is
testable on any machine by replaying a dataset in which every configuration was measured once.
Three layouts are read, detected from the content, never from the file name; gzip is detected by
its magic bytes, so ``.json`` and ``.json.gz`` are interchangeable:

``kernel_tuner``
    A Kernel Tuner cache file: a header (``device_name``, ``kernel_name``, ``problem_size``,
    ``tune_params_keys``, ``tune_params``, ``objective``) and ``"cache": {"v1,v2,...": entry}``.
    Kernel Tuner appends one entry per line and closes the file only at the end of a run, so a
    cache left by an interrupted run lacks its final ``}\\n}`` and may end after a comma or inside
    an entry; such a file is read up to its last complete entry. The failure marker is in the
    objective field (``"time": "RuntimeFailedConfig"``) in older caches and in ``__error__`` in
    newer ones. Configurations that break the restrictions are absent from a cache.
``t4``
    The T4 results format (``{"metadata", "schema_version", "results": [...]}``), which does not
    carry the parameter lists: they are the sorted distinct values found in the results.
``surrotune``
    surrotune's own recording, written by :func:`save_recording`: gzipped (or plain) JSON holding
    ``Result.to_record()`` rows. See :func:`save_recording` for the layout.

Status mapping (DESIGN.md, "Status: the failure taxonomy"):

=============================  ===================  ===============
Kernel Tuner marker            T4 ``invalidity``    Status
=============================  ===================  ===============
(a number)                     ``correct``          ``ok``
``CompilationFailedConfig``    ``compile``          ``compile``
``RuntimeFailedConfig``        ``runtime``          ``resource``
``InvalidConfig``              ``constraints``      ``constraint``
\\-                             ``correctness``      ``correctness``
\\-                             ``timeout``          ``timeout``
=============================  ===================  ===============

Kernel Tuner writes ``RuntimeFailedConfig`` when the launch fails, in practice because the
configuration needs more resources than the device has, and T4's ``runtime`` is that same marker
converted, so both map to ``resource``. An unknown marker is an error rather than a guess.

Objective: the cache's ``objective`` key (``time``, in ms, unless the file says otherwise);
maximised when its name contains ``/s`` (``GFLOP/s``, ``GB/s``), minimised otherwise.
Timing: ``compile_time_ms`` is Kernel Tuner's ``compile_time`` (T4 ``compilation``) and
``benchmark_time_ms`` is ``verification_time + benchmark_time`` (T4 ``validation`` plus
``benchmark``, or the sum of ``runtimes`` where ``benchmark`` is absent). Their sum over the
evaluated configurations is the simulated tuning time of a replayed run. Other per-entry fields
(``GFLOP/s``, ``framework_time``, ``timestamp`` ...) are dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import os
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from surrotune.errors import SurrotuneError
from surrotune.result import ParamValue, Result, Status

__all__ = [
    "KT_FAILURES",
    "RECORDING_FORMAT",
    "RECORDING_VERSION",
    "T4_INVALIDITY",
    "Dataset",
    "DatasetError",
    "ReplayBackend",
    "load_dataset",
    "load_restrictions",
    "save_recording",
]

RECORDING_FORMAT = "surrotune-recording"
RECORDING_VERSION = 1

#: Kernel Tuner failure marker -> Status
KT_FAILURES: dict[str, Status] = {
    "CompilationFailedConfig": Status.COMPILE,
    "RuntimeFailedConfig": Status.RESOURCE,
    "InvalidConfig": Status.CONSTRAINT,
}

#: T4 ``invalidity`` value -> Status
T4_INVALIDITY: dict[str, Status] = {
    "correct": Status.OK,
    "compile": Status.COMPILE,
    "runtime": Status.RESOURCE,
    "constraints": Status.CONSTRAINT,
    "correctness": Status.CORRECTNESS,
    "timeout": Status.TIMEOUT,
}

#: T4 ``metadata.timeunit`` -> factor to milliseconds ("miliseconds" is what Kernel Tuner writes)
_T4_TIME_UNITS: dict[str, float] = {
    "seconds": 1e3,
    "s": 1e3,
    "milliseconds": 1.0,
    "miliseconds": 1.0,
    "ms": 1.0,
    "microseconds": 1e-3,
    "us": 1e-3,
}

_GZIP_MAGIC = b"\x1f\x8b"
_KT_CACHE_MARKER = '"cache":'


class DatasetError(SurrotuneError, ValueError):
    """A dataset file that cannot be read: names the file, what was expected and what was found."""


def _direction_for(objective: str) -> str:
    """Rates (``GFLOP/s``, ``GB/s``) are maximised; times and everything else are minimised."""
    return "maximize" if "/s" in objective else "minimize"


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds, so keys and JSON see ints, floats and strs."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class Dataset:
    """A recorded brute-force dataset: every measured configuration of one kernel on one device.

    ``results`` is keyed like a Kernel Tuner cache: the parameter values in ``parameters`` order,
    each as ``str(value)`` of the value in the file, joined by commas. :meth:`key` builds that key
    from any configuration, so ``16``, ``16.0`` and ``numpy.int64(16)`` find the same entry.
    ``metadata["device"]`` is always the device descriptor (at least its ``name``).
    """

    path: Path
    format: str
    kernel_name: str
    device_name: str
    problem_size: Any
    parameters: dict[str, list[ParamValue]]
    objective: str
    direction: str
    results: Mapping[str, Result]
    constraints: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    _labels: tuple[tuple[str, dict[Any, str]], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(f"direction must be 'minimize' or 'maximize', got {self.direction!r}")
        object.__setattr__(self, "constraints", tuple(self.constraints))
        # value -> its spelling in the file; 16 == 16.0 == np.int64(16) hash alike, so one dict
        # lookup normalises integral floats and NumPy scalars to the recorded spelling.
        labels = tuple(
            (name, {value: str(value) for value in values})
            for name, values in self.parameters.items()
        )
        object.__setattr__(self, "_labels", labels)

    def size_differences(
        self, sizes: Mapping[str, int | float]
    ) -> dict[str, tuple[int | float, Any]]:
        """``name -> (asked, recorded)`` for each of ``sizes`` the recording does not hold at
        that value (recorded None: the recording names no such size)."""
        recorded = self.problem_size if isinstance(self.problem_size, Mapping) else {}
        return {k: (v, recorded.get(k)) for k, v in sizes.items() if recorded.get(k) != v}

    def key(self, config: Mapping[str, ParamValue]) -> str:
        """The ``results`` key of ``config``; names not among the parameters are ignored."""
        parts = []
        for name, spelling in self._labels:
            try:
                value = config[name]
            except KeyError:
                raise KeyError(
                    f"configuration {dict(config)!r} lacks parameter {name!r}; "
                    f"{self.path} has parameters {list(self.parameters)}"
                ) from None
            try:
                parts.append(spelling.get(value, str(_plain(value))))
            except TypeError:  # unhashable value: it cannot be in the recording
                parts.append(str(value))
        return ",".join(parts)

    def lookup(self, config: Mapping[str, ParamValue]) -> Result | None:
        """The recorded Result of ``config``, or None when the recording lacks it."""
        return self.results.get(self.key(config))

    def to_frame(self) -> pd.DataFrame:
        """One row per recorded result: the parameters, then the Result's fields.

        The index is the ``results`` key, so frames of two datasets of one kernel align.
        """
        rows = []
        for result in self.results.values():
            attrs = result.to_user_attrs()
            del attrs["config_key"], attrs["times_ms"], attrs["counters"]
            rows.append({**{name: result.config.get(name) for name in self.parameters}, **attrs})
        frame = pd.DataFrame.from_records(rows)
        frame.index = pd.Index(list(self.results), name="config_key")
        return frame

    @property
    def optimum(self) -> Result:
        """The best ``ok`` result, by ``direction``."""
        ok = [r for r in self.results.values() if r.ok]
        if not ok:
            raise DatasetError(f"{self.path}: no configuration has status ok, so no optimum")
        pick = max if self.direction == "maximize" else min
        return pick(ok, key=lambda r: r.objective)


# ---------------------------------------------------------------------------- reading files


def _read_text(path: Path) -> str:
    """The file's text, gunzipped if it starts with gzip's magic; a cut gzip gives its prefix."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except EOFError:  # the gzip stream itself was cut: keep what it holds
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
        except (OSError, zlib.error) as exc:
            raise DatasetError(
                f"{path}: starts like gzip but does not decompress ({exc})"
            ) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: expected UTF-8 JSON text, found binary data ({exc})") from exc


def _parse_json(path: Path, text: str) -> Any:
    """The parsed document; an unclosed Kernel Tuner cache is closed after its last whole entry."""
    if not text.strip():
        raise DatasetError(f"{path}: the file is empty; expected a JSON dataset")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        start = text.find(_KT_CACHE_MARKER)
        if start < 0:
            raise DatasetError(f"{path}: not valid JSON ({exc})") from exc
        repaired = _close_kt_cache(text, start)
        if repaired is None:
            raise DatasetError(
                f"{path}: not valid JSON ({exc}), and not an unclosed Kernel Tuner cache "
                "either (closing it after its last complete entry line did not parse)"
            ) from exc
        return repaired


def _close_kt_cache(text: str, cache_start: int) -> Any | None:
    """Kernel Tuner's own repair (drop a trailing comma, append ``}\\n}``), plus one step back.

    Entries are written one per line, so when the run died in the middle of a line, dropping that
    last partial line leaves only complete entries. An entry needs three closing braces to be
    completed (its own, the cache's, the document's) and we offer at most two, so a partial entry
    can never parse as a complete one.
    """
    body = text.rstrip()
    for _ in range(2):
        stripped = body.rstrip().removesuffix(",")
        for closing in ("}\n}", "\n}"):
            try:
                return json.loads(stripped + closing)
            except json.JSONDecodeError:
                pass
        cut = body.rfind("\n")
        if cut <= cache_start:
            return None
        body = body[:cut]
    return None


def _require(path: Path, doc: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in doc:
        raise DatasetError(f"{path}: {what} lacks the key {key!r}; found keys {sorted(doc)}")
    return doc[key]


def _sum_known(*values: Any) -> float | None:
    """Sum of the numeric values; None when none is numeric (the file did not record it)."""
    known = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return math.fsum(known) if known else None


def _device_name(path: Path, name: Any) -> str:
    """The recorded name; the file's stem where the recording has none (e.g. KT on ROCm)."""
    if isinstance(name, str) and name:
        return name
    return path.name.split(".")[0]


def _kt_result(
    path: Path, key: str, entry: Mapping[str, Any], names: Sequence[str], objective: str
) -> Result:
    config = {name: entry[name] for name in names if name in entry}
    marker = entry.get("__error__")
    if not isinstance(marker, str) or not marker:
        marker = next(
            (entry[k] for k in (objective, "time") if isinstance(entry.get(k), str)), None
        )
    common: dict[str, Any] = {
        "config": config,
        "times_ms": tuple(entry.get("times") or ()),
        "compile_time_ms": _sum_known(entry.get("compile_time")),
        "benchmark_time_ms": _sum_known(
            entry.get("verification_time"), entry.get("benchmark_time")
        ),
        "registers": entry.get("num_regs"),
    }
    if marker is not None:
        if marker not in KT_FAILURES:
            raise DatasetError(
                f"{path}: entry {key!r} has the unknown failure marker {marker!r}; "
                f"expected a number or one of {sorted(KT_FAILURES)}"
            )
        return Result(status=KT_FAILURES[marker], error=marker, **common)
    value = entry.get(objective)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise DatasetError(
            f"{path}: entry {key!r} has no finite objective {objective!r} and no failure "
            f"marker; found {value!r}"
        )
    return Result(status=Status.OK, objective=value, **common)


def _load_kernel_tuner(path: Path, doc: Mapping[str, Any]) -> Dataset:
    what = "a Kernel Tuner cache"
    names = list(_require(path, doc, "tune_params_keys", what))
    tune_params = _require(path, doc, "tune_params", what)
    cache = _require(path, doc, "cache", what)
    if not isinstance(cache, dict) or not isinstance(tune_params, dict):
        raise DatasetError(f"{path}: 'cache' and 'tune_params' must be JSON objects")
    missing = [name for name in names if name not in tune_params]
    if missing:
        raise DatasetError(f"{path}: tune_params lacks the values of {missing}")
    objective = doc.get("objective") or "time"
    results = {key: _kt_result(path, key, entry, names, objective) for key, entry in cache.items()}
    device_name = _device_name(path, doc.get("device_name"))
    used = {"device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params"}
    extra = {k: v for k, v in doc.items() if k not in used and k != "cache"}
    return Dataset(
        path=path,
        format="kernel_tuner",
        kernel_name=str(doc.get("kernel_name", "")),
        device_name=device_name,
        problem_size=doc.get("problem_size"),
        parameters={name: list(tune_params[name]) for name in names},
        objective=objective,
        direction=_direction_for(objective),
        results=results,
        metadata={**extra, "device": {"name": device_name}},
    )


def _t4_result(path: Path, i: int, row: Mapping[str, Any], objective: str, scale: float) -> Result:
    config = dict(_require(path, row, "configuration", f"T4 result {i}"))
    invalidity = _require(path, row, "invalidity", f"T4 result {i}")
    if invalidity not in T4_INVALIDITY:
        raise DatasetError(
            f"{path}: T4 result {i} has the unknown invalidity {invalidity!r}; "
            f"expected one of {sorted(T4_INVALIDITY)}"
        )
    status = T4_INVALIDITY[invalidity]
    times = row.get("times") or {}
    runtimes = list(times.get("runtimes") or ())
    benchmark = times.get("benchmark")
    if benchmark is None and runtimes:
        benchmark = math.fsum(runtimes)
    compile_ms = _sum_known(times.get("compilation"))
    bench_ms = _sum_known(times.get("validation"), benchmark)
    common: dict[str, Any] = {
        "config": config,
        "times_ms": [float(t) * scale for t in runtimes],
        "compile_time_ms": None if compile_ms is None else compile_ms * scale,
        "benchmark_time_ms": None if bench_ms is None else bench_ms * scale,
    }
    if status is not Status.OK:
        return Result(status=status, error=invalidity, **common)
    values = {m.get("name"): m.get("value") for m in row.get("measurements") or ()}
    if objective not in values:
        raise DatasetError(
            f"{path}: T4 result {i} is 'correct' but has no measurement named {objective!r}; "
            f"found {sorted(map(str, values))}"
        )
    value = float(values[objective]) * (scale if objective == "time" else 1.0)
    return Result(status=status, objective=value, **common)


def _sorted_values(values: list[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types: keep the order of first appearance
        return values


def _load_t4(path: Path, doc: Mapping[str, Any]) -> Dataset:
    rows = doc["results"]
    metadata = dict(doc.get("metadata") or {})
    unit = str(metadata.get("timeunit", "milliseconds")).lower()
    if unit not in _T4_TIME_UNITS:
        raise DatasetError(
            f"{path}: unknown T4 metadata.timeunit {unit!r}; "
            f"expected one of {sorted(_T4_TIME_UNITS)}"
        )
    objectives = next((r.get("objectives") for r in rows if r.get("objectives")), None) or []
    objective = str(objectives[0]) if objectives else "time"
    names: dict[str, list[Any]] = {}
    results: dict[str, Result] = {}
    parsed = [
        _t4_result(path, i, row, objective, _T4_TIME_UNITS[unit]) for i, row in enumerate(rows)
    ]
    for result in parsed:
        for name, value in result.config.items():
            names.setdefault(name, []).append(value)
    parameters = {
        name: _sorted_values(list(dict.fromkeys(values))) for name, values in names.items()
    }
    device_name = _device_name(path, metadata.get("device_name") or metadata.get("device"))
    dataset = Dataset(
        path=path,
        format="t4",
        kernel_name=str(metadata.get("kernel_name", "")),
        device_name=device_name,
        problem_size=metadata.get("problem_size"),
        parameters=parameters,
        objective=objective,
        direction=_direction_for(objective),
        results=results,
        metadata={
            **metadata,
            "schema_version": doc.get("schema_version"),
            "device": {"name": device_name},
        },
    )
    for result in parsed:
        results[dataset.key(result.config)] = result
    return dataset


def _load_recording(path: Path, doc: Mapping[str, Any]) -> Dataset:
    version = doc.get("version")
    if version != RECORDING_VERSION:
        raise DatasetError(
            f"{path}: surrotune recording version {version!r} is not supported; "
            f"this surrotune reads version {RECORDING_VERSION}"
        )
    what = "a surrotune recording"
    parameters = {k: list(v) for k, v in _require(path, doc, "parameters", what).items()}
    device = dict(_require(path, doc, "device", what))
    objective = _require(path, doc, "objective", what)
    records = _require(path, doc, "results", what)
    metadata = dict(doc.get("metadata") or {})
    results: dict[str, Result] = {}
    try:
        dataset = Dataset(
            path=path,
            format="surrotune",
            kernel_name=str(_require(path, doc, "kernel_name", what)),
            device_name=_device_name(path, device.get("name")),
            problem_size=doc.get("problem_size"),
            parameters=parameters,
            objective=str(objective["name"]),
            direction=str(objective["direction"]),
            results=results,
            constraints=tuple(doc.get("constraints") or ()),
            metadata={**metadata, "device": device},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{path}: malformed surrotune recording header: {exc!r}") from exc
    for i, record in enumerate(records):
        try:
            result = Result.from_record(record)
            results[dataset.key(result.config)] = result
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(
                f"{path}: malformed surrotune recording result {i}: {exc!r}"
            ) from exc
    return dataset


def load_dataset(path: str | Path) -> Dataset:
    """Read a Kernel Tuner cache, a T4 file or a surrotune recording, detected from its content.

    Raises:
        DatasetError: the file is unreadable, not JSON, of an unknown layout, or lacks a key.
    """
    path = Path(path)
    doc = _parse_json(path, _read_text(path))
    if not isinstance(doc, dict):
        raise DatasetError(f"{path}: expected a JSON object, found {type(doc).__name__}")
    if doc.get("format") == RECORDING_FORMAT:
        return _load_recording(path, doc)
    if "cache" in doc and "tune_params_keys" in doc:
        return _load_kernel_tuner(path, doc)
    if isinstance(doc.get("results"), list) and ("schema_version" in doc or "metadata" in doc):
        return _load_t4(path, doc)
    raise DatasetError(
        f"{path}: unknown layout; expected a Kernel Tuner cache ('tune_params_keys', 'cache'), "
        f"a T4 file ('metadata', 'results') or a surrotune recording "
        f"('format': {RECORDING_FORMAT!r}); found keys {sorted(doc)}"
    )


def load_restrictions(path: str | Path) -> list[str]:
    """The restriction expressions of a benchmark-hub ``spaces/*.json`` file.

    Kernel Tuner caches and T4 files do not carry the restrictions of their search space; these
    files do, as ``ConfigurationSpace.Conditions[].Expression``. Pass them as ``constraints``
    (``dataclasses.replace(dataset, constraints=...)``) to know the feasible space.
    """
    path = Path(path)
    doc = _parse_json(path, _read_text(path))
    space = doc.get("ConfigurationSpace") if isinstance(doc, dict) else None
    if not isinstance(space, dict):
        raise DatasetError(f"{path}: expected a JSON object with a 'ConfigurationSpace' object")
    conditions = space.get("Conditions") or []
    try:
        return [str(condition["Expression"]) for condition in conditions]
    except (KeyError, TypeError) as exc:
        raise DatasetError(
            f"{path}: every ConfigurationSpace.Conditions item needs an 'Expression'"
        ) from exc


# ---------------------------------------------------------------------------- writing


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_recording(
    path: str | Path,
    results: Sequence[Result],
    *,
    parameters: Mapping[str, Sequence[ParamValue]],
    kernel_name: str,
    device: Mapping[str, Any],
    problem_size: Mapping[str, Any],
    objective: str,
    direction: str,
    constraints: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write results as a surrotune recording that :func:`load_dataset` reads back.

    The layout is ``{"format": "surrotune-recording", "version": 1, "kernel_name", "device",
    "problem_size", "parameters", "constraints", "objective": {"name", "direction"}, "metadata",
    "results": [Result.to_record(), ...]}``, gzipped when the name ends in ``.gz``. The file is
    written to a temporary file beside it and moved into place, so a reader never sees half a
    recording and an interrupted write leaves the old file intact.
    """
    path = Path(path)
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
    if metadata and "device" in metadata:
        raise ValueError("metadata must not hold 'device'; pass the descriptor as device=")
    doc = {
        "format": RECORDING_FORMAT,
        "version": RECORDING_VERSION,
        "kernel_name": kernel_name,
        "device": dict(device),
        "problem_size": dict(problem_size),
        "parameters": {name: list(values) for name, values in parameters.items()},
        "constraints": list(constraints),
        "objective": {"name": objective, "direction": direction},
        "metadata": dict(metadata or {}),
        "results": [result.to_record() for result in results],
    }
    data = json.dumps(doc, default=_json_default).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a recording is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------- the backend


class ReplayBackend:
    """A Backend that answers from a Dataset: the recorded Result, with the config as asked.

    A configuration the recording lacks is a ``constraint`` Result: brute-force caches omit the
    configurations that break the restrictions, so that is what a missing one almost always is.
    ``simulated_time_ms`` sums the recorded compile and benchmark times of every evaluation
    (repeats included, as a real GPU would pay them again): the tuning time the run would have
    taken on the recorded device, excluding the tuner's own overhead.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.simulated_time_ms = 0.0
        self.evaluations = 0

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
        answers = []
        for config in configs:
            recorded = self.dataset.lookup(config)
            if recorded is None:
                answers.append(
                    Result(
                        config=dict(config),
                        status=Status.CONSTRAINT,
                        error=f"not in the recording {self.dataset.path}",
                    )
                )
                continue
            self.evaluations += int(recorded.status.counts_as_evaluation)
            self.simulated_time_ms += (recorded.compile_time_ms or 0.0) + (
                recorded.benchmark_time_ms or 0.0
            )
            answers.append(dataclasses.replace(recorded, config=dict(config)))
        return answers

    def device(self) -> dict[str, Any]:
        """The recorded device descriptor; ``name`` is always present."""
        return {
            **dict(self.dataset.metadata.get("device") or {}),
            "name": self.dataset.device_name,
        }

    def close(self) -> None:
        """Nothing to release: the dataset lives in memory."""
