"""The experiment file: parsed and validated once, before anything runs.

An experiment is a TOML file (``docs/experiment.md`` documents every key). Every mistake is
reported as an :class:`ExperimentError` that names the file, the key and what was expected, so
that a user fixes it in one go; nothing is compiled, measured or written for an invalid file.
Expressions (shapes, grid, block, constraints, objective formulas) are parsed here into
whitelisted ASTs (:mod:`surrotune.expressions`), never passed to ``eval``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from surrotune.backends.measure import L2_FLUSH_MODES
from surrotune.errors import SurrotuneError
from surrotune.expressions import Expression, ExpressionError
from surrotune.result import ParamValue
from surrotune.template import Template, TemplateError

#: ``[evaluation] counters``: which trials Nsight Compute profiles at the end of a run
#: (surrotune.counters.policy.CountersMode; kept here so that reading an experiment needs no
#: Optuna import)
COUNTERS_MODES = ("none", "elite", "failures", "all")

__all__ = [
    "ArgumentSpec",
    "EvaluationSettings",
    "Experiment",
    "ExperimentError",
    "KernelSpec",
    "LaunchSpec",
    "ObjectiveSpec",
    "ReferenceSpec",
    "SearchSettings",
    "StorageSettings",
    "load_experiment",
    "parse_duration",
]

#: the samplers an experiment may name; ``surrotune.sampling.SAMPLER_NAMES`` is this tuple (it
#: lives here because loading an experiment needs no Optuna)
SAMPLERS = (
    "random", "tpe", "tpe-multivariate", "tpe-independent", "gp", "brute-force", "surrogate",
)
BACKENDS = ("cuda", "replay")
FILLS = ("random", "randint", "ones", "zeros", "output")
METRICS = {"time": "minimize", "GFLOP/s": "maximize", "GB/s": "maximize"}


class ExperimentError(SurrotuneError, ValueError):
    """A bad experiment file: which file, which key, what was expected."""

    def __init__(self, file: Path | str, key: str, message: str) -> None:
        self.file = str(file)
        self.key = key
        self.message = message
        where = f"{self.file}: {key}: " if key else f"{self.file}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class KernelSpec:
    """The kernel template and how to compile it."""

    template: Path
    name: str
    compiler: str = "auto"  # nvrtc where libnvrtc is found, else nvcc (backends.compile)
    options: tuple[str, ...] = ()
    arch: str | None = None  # None: the device's own (sm_XY)


@dataclass(frozen=True)
class ArgumentSpec:
    """One kernel argument: an array (``shape`` set) or a scalar (``value`` set)."""

    name: str
    dtype: str
    shape: tuple[Expression, ...] | None = None
    value: Expression | None = None
    fill: str = "random"
    output: bool = False

    @property
    def is_array(self) -> bool:
        return self.shape is not None


@dataclass(frozen=True)
class LaunchSpec:
    """Grid, block and dynamic shared memory as expressions over sizes and parameters."""

    grid: tuple[Expression, ...]
    block: tuple[Expression, ...]
    shared_memory: Expression


@dataclass(frozen=True)
class ObjectiveSpec:
    """What is optimised: kernel time, or a rate computed from declared flops or bytes."""

    metric: str = "time"
    flops: Expression | None = None
    bytes: Expression | None = None

    @property
    def direction(self) -> str:
        return METRICS[self.metric]

    def value(self, time_ms: float, env: Mapping[str, Any]) -> float:
        """The objective for a kernel that ran in ``time_ms``."""
        if self.metric == "time":
            return time_ms
        work = self.flops if self.metric == "GFLOP/s" else self.bytes
        assert work is not None  # checked by the parser
        return float(work.evaluate(env)) / (time_ms * 1e-3) / 1e9

    def rates(self, time_ms: float, env: Mapping[str, Any]) -> dict[str, float]:
        """Every rate that can be derived from a time, for summaries."""
        out = {}
        if self.flops is not None:
            out["GFLOP/s"] = float(self.flops.evaluate(env)) / (time_ms * 1e-3) / 1e9
        if self.bytes is not None:
            out["GB/s"] = float(self.bytes.evaluate(env)) / (time_ms * 1e-3) / 1e9
        return out


@dataclass(frozen=True)
class ReferenceSpec:
    """A Python function that computes the expected outputs from the inputs."""

    path: Path
    function: str
    rtol: float = 1e-5


@dataclass(frozen=True)
class SearchSettings:
    sampler: str = "surrogate"
    trials: int = 100
    timeout_s: float | None = None
    seed: int | None = None
    batch_size: int = 8


@dataclass(frozen=True)
class EvaluationSettings:
    """How configurations are evaluated; see :class:`surrotune.backends.measure.MeasurePolicy`
    for how ``warmup`` to ``max_measure_s`` decide the number of timed launches."""

    backend: str = "cuda"
    dataset: Path | None = None
    warmup: int = 3
    repeats: int = 10  # timed launches: the minimum, or exactly this many with max_repeats None
    kernel_timeout_s: float = 10.0
    compile_workers: int | None = None
    seed: int = 0  # seed of the random inputs
    max_repeats: int | None = 200  # None: exactly ``repeats`` (the file said ``repeats = N``)
    target_precision: float = 0.01  # half-width of the median's 95 % interval, relative
    max_measure_s: float = 1.0  # wall-time cap on the timed rounds of one configuration
    l2_flush: str = "auto"  # auto, always or never (backends.measure.choose_l2_flush)
    counters: str = "none"  # none, elite, failures or all (surrotune.counters.policy)
    counters_budget: float = 0.1  # share of the run's wall time profiling may take


@dataclass(frozen=True)
class StorageSettings:
    url: str
    study: str
    # workers sharing the study (docs/distributed.md): how often each writes its heartbeat, and
    # how long a silent one is presumed alive before its trials are failed and retried
    heartbeat_interval_s: float = 10.0
    grace_period_s: float = 60.0


@dataclass(frozen=True)
class Experiment:
    """A validated experiment. Paths are absolute; expressions are parsed."""

    path: Path
    kernel: KernelSpec | None
    sizes: Mapping[str, int | float]
    arguments: tuple[ArgumentSpec, ...]
    launch: LaunchSpec | None
    parameters: Mapping[str, tuple[ParamValue, ...]]
    constraints: tuple[str, ...]
    objective: ObjectiveSpec
    reference: ReferenceSpec | None
    search: SearchSettings
    evaluation: EvaluationSettings
    storage: StorageSettings
    notes: tuple[str, ...] = field(default=())

    def with_overrides(self, **changes: Any) -> Experiment:
        """A copy with search/evaluation/storage fields replaced (for command-line flags)."""
        search = {k: v for k, v in changes.items() if k in SearchSettings.__dataclass_fields__}
        evaluation = {
            k: v for k, v in changes.items() if k in EvaluationSettings.__dataclass_fields__
        }
        storage = {k: v for k, v in changes.items() if k in StorageSettings.__dataclass_fields__}
        unknown = set(changes) - set(search) - set(evaluation) - set(storage)
        if unknown:
            raise TypeError(f"unknown override(s): {', '.join(sorted(unknown))}")
        return replace(
            self,
            search=replace(self.search, **search),
            evaluation=replace(self.evaluation, **evaluation),
            storage=replace(self.storage, **storage),
        )


# --------------------------------------------------------------------------- parsing helpers


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | int | float) -> float:
    """``"30m"`` → 1800.0 seconds; plain numbers are seconds."""
    if isinstance(text, bool):
        raise ValueError("expected a duration like 90, '90s', '30m' or '2h'")
    if isinstance(text, (int, float)):
        if text <= 0:
            raise ValueError(f"expected a positive duration, got {text}")
        return float(text)
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"expected a duration like 90, '90s', '30m' or '2h', got {text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


class _Reader:
    """Reads one TOML file, remembering the file name for every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> ExperimentError:
        return ExperimentError(self.path, key, message)

    def table(self, data: Mapping[str, Any], key: str, allowed: Sequence[str]) -> dict[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table [{key}], got {type(value).__name__}")
        self.check_keys(value, key, allowed)
        return value

    def check_keys(self, table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
        unknown = [k for k in table if k not in allowed]
        if unknown:
            name = f"{where}.{unknown[0]}" if where else unknown[0]
            raise self.fail(name, f"unknown key; expected one of: {', '.join(sorted(allowed))}")

    def string(self, table: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
        if key not in table:
            if default is ...:
                raise self.fail(f"{where}.{key}", "missing; expected a string")
            return default
        value = table[key]
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}.{key}", f"expected a non-empty string, got {value!r}")
        return value

    def integer(
        self, table: Mapping[str, Any], key: str, where: str, default: Any, minimum: int = 0
    ) -> Any:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{where}.{key}", f"expected an integer >= {minimum}, got {value!r}")
        return value

    def number(self, table: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self.fail(f"{where}.{key}", f"expected a positive number, got {value!r}")
        return float(value)

    def choice(
        self, table: Mapping[str, Any], key: str, where: str, options: Sequence[str], default: str
    ) -> str:
        value = table.get(key, default)
        if value not in options:
            raise self.fail(
                f"{where}.{key}", f"expected one of {', '.join(options)}, got {value!r}"
            )
        return str(value)

    def expression(self, text: Any, key: str, known: Sequence[str]) -> Expression:
        try:
            return Expression.parse(text, known=known)
        except ExpressionError as exc:
            raise self.fail(key, str(exc)) from None

    def file(self, text: Any, key: str) -> Path:
        if not isinstance(text, str) or not text:
            raise self.fail(key, f"expected a path (a string), got {text!r}")
        path = (self.path.parent / text).resolve()
        if not path.is_file():
            raise self.fail(key, f"file not found: {path}")
        return path


# --------------------------------------------------------------------------- the sections

TOP_LEVEL = (
    "name", "description", "kernel", "sizes", "arguments", "launch", "parameters",
    "constraints", "objective", "reference", "search", "evaluation", "storage",
)  # fmt: skip


def _parameter_values(reader: _Reader, name: str, spec: Any) -> tuple[ParamValue, ...]:
    """An ordered value list, or a range shorthand: ``{range = [lo, hi, step]}`` (hi included)
    or ``{pow2 = [lo, hi]}`` (powers of two from lo to hi)."""
    key = f"parameters.{name}"
    if isinstance(spec, list):
        if not spec:
            raise reader.fail(key, "expected at least one value")
        for value in spec:
            if not isinstance(value, (int, float, str, bool)):
                raise reader.fail(key, f"expected numbers, strings or booleans, got {value!r}")
        kinds = {type(v) for v in spec}
        if len(kinds) > 1 and not kinds <= {int, float}:
            raise reader.fail(key, f"expected values of one type, got {spec!r}")
        if len(set(spec)) != len(spec):
            raise reader.fail(key, f"expected distinct values, got {spec!r}")
        return tuple(spec)
    if isinstance(spec, dict) and len(spec) == 1 and "range" in spec:
        bounds = spec["range"]
        if (
            not isinstance(bounds, list)
            or len(bounds) not in (2, 3)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
            or (len(bounds) == 3 and bounds[2] <= 0)
            or bounds[1] < bounds[0]
        ):
            raise reader.fail(
                key, f"expected range = [first, last] or [first, last, step>0], got {bounds!r}"
            )
        step = bounds[2] if len(bounds) == 3 else 1
        return tuple(range(bounds[0], bounds[1] + 1, step))
    if isinstance(spec, dict) and len(spec) == 1 and "pow2" in spec:
        bounds = spec["pow2"]
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bounds)
            or bounds[1] < bounds[0]
        ):
            raise reader.fail(key, f"expected pow2 = [first, last] (positive), got {bounds!r}")
        values: list[int] = []
        value = 1
        while value <= bounds[1]:
            if value >= bounds[0]:
                values.append(value)
            value *= 2
        if not values:
            raise reader.fail(key, f"pow2 = {bounds!r} contains no power of two")
        return tuple(values)
    raise reader.fail(
        key, "expected a list of values, {range = [first, last, step]} or {pow2 = [first, last]}"
    )


def _parse_arguments(
    reader: _Reader, raw: Any, sizes: Sequence[str], names: Sequence[str]
) -> tuple[ArgumentSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise reader.fail(
            "arguments", "expected an array of tables [[arguments]], one per argument"
        )
    out = []
    seen = set()
    allowed = ("name", "dtype", "shape", "value", "fill", "output")
    for i, arg in enumerate(raw):
        where = f"arguments[{i}]"
        if not isinstance(arg, dict):
            raise reader.fail(where, "expected a table")
        reader.check_keys(arg, where, allowed)
        name = reader.string(arg, "name", where)
        if name in seen:
            raise reader.fail(f"{where}.name", f"duplicate argument name {name!r}")
        seen.add(name)
        dtype = reader.string(arg, "dtype", where)
        try:
            np.dtype(dtype)
        except TypeError:
            raise reader.fail(
                f"{where}.dtype", f"expected a NumPy dtype name, got {dtype!r}"
            ) from None
        has_shape, has_value = "shape" in arg, "value" in arg
        if has_shape == has_value:
            raise reader.fail(
                where, "expected exactly one of 'shape' (an array) or 'value' (a scalar)"
            )
        shape = value = None
        if has_shape:
            raw_shape = arg["shape"]
            if not isinstance(raw_shape, list) or not raw_shape:
                raise reader.fail(
                    f"{where}.shape", f"expected a list of expressions, got {raw_shape!r}"
                )
            shape = tuple(reader.expression(s, f"{where}.shape", sizes) for s in raw_shape)
        else:
            value = reader.expression(arg["value"], f"{where}.value", sizes)
        fill = reader.choice(arg, "fill", where, FILLS, "random")
        output = arg.get("output", fill == "output")
        if not isinstance(output, bool):
            raise reader.fail(f"{where}.output", f"expected true or false, got {output!r}")
        if output and not has_shape:
            raise reader.fail(f"{where}.output", "a scalar argument cannot be an output")
        out.append(ArgumentSpec(name, dtype, shape, value, fill, output))
    if not any(a.output for a in out):
        raise reader.fail("arguments", "expected at least one argument with output = true")
    del names
    return tuple(out)


def _parse_repeats(reader: _Reader, table: Mapping[str, Any]) -> tuple[int, int | None]:
    """``repeats = N`` (exactly N timed launches, as before adaptive timing) or
    ``min_repeats``/``max_repeats`` (time until the median is known to ``target_precision``).

    Returns the minimum and the maximum; a maximum of None means "exactly the minimum".
    """
    if "repeats" in table:
        for key in ("min_repeats", "max_repeats"):
            if key in table:
                raise reader.fail(
                    f"evaluation.{key}",
                    "give either repeats (exactly that many timed launches) or "
                    "min_repeats/max_repeats (timed until the median is known to "
                    "target_precision), not both",
                )
        return reader.integer(table, "repeats", "evaluation", 10, minimum=1), None
    minimum = reader.integer(table, "min_repeats", "evaluation", 10, minimum=1)
    maximum = reader.integer(table, "max_repeats", "evaluation", max(200, minimum), minimum=1)
    if maximum < minimum:
        raise reader.fail(
            "evaluation.max_repeats",
            f"expected an integer >= min_repeats ({minimum}), got {maximum}",
        )
    return minimum, maximum


def _parse_precision(reader: _Reader, table: Mapping[str, Any]) -> float:
    value = table.get("target_precision", 0.01)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise reader.fail(
            "evaluation.target_precision",
            f"expected a number between 0 and 1 (0.01: the median known to ±1 %), got {value!r}",
        )
    return float(value)


def _parse_share(reader: _Reader, table: Mapping[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise reader.fail(
            f"evaluation.{key}",
            f"expected a share of the run's wall time, above 0 and at most 1, got {value!r}",
        )
    return float(value)


def _parse_duration_key(
    reader: _Reader, table: Mapping[str, Any], key: str, default: float
) -> float:
    try:
        return parse_duration(table.get(key, default))
    except ValueError as exc:
        raise reader.fail(f"evaluation.{key}", str(exc)) from None


def load_experiment(
    path: str | Path, *, sizes: Mapping[str, int | float] | None = None
) -> Experiment:
    """Read and validate an experiment file. Raises :class:`ExperimentError`.

    ``sizes``: problem sizes that replace the file's (``surrotune run --size M=4096``), so that
    one experiment file tunes the same kernel at every size it is used at; each must be a size
    the file names.
    """
    size_overrides = dict(sizes or {})
    path = Path(path).resolve()
    reader = _Reader(path)
    if not path.is_file():
        raise ExperimentError(path, "", "file not found")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExperimentError(path, "", f"not valid TOML: {exc}") from None
    reader.check_keys(data, "", TOP_LEVEL)
    notes: list[str] = []

    # -- evaluation first: the backend decides which sections are required
    evaluation_t = reader.table(
        data, "evaluation",
        ("backend", "dataset", "warmup", "repeats", "kernel_timeout", "compile_workers", "seed",
         "min_repeats", "max_repeats", "target_precision", "max_measure_time", "l2_flush",
         "counters", "counters_budget"),
    )  # fmt: skip
    backend = reader.choice(evaluation_t, "backend", "evaluation", BACKENDS, "cuda")
    dataset = None
    if "dataset" in evaluation_t:
        dataset = reader.file(evaluation_t["dataset"], "evaluation.dataset")
    if backend == "replay" and dataset is None:
        raise reader.fail("evaluation.dataset", "missing; the replay backend needs a recording")
    kernel_timeout = evaluation_t.get("kernel_timeout", 10.0)
    try:
        kernel_timeout_s = parse_duration(kernel_timeout)
    except ValueError as exc:
        raise reader.fail("evaluation.kernel_timeout", str(exc)) from None
    repeats, max_repeats = _parse_repeats(reader, evaluation_t)
    evaluation = EvaluationSettings(
        backend=backend,
        dataset=dataset,
        warmup=reader.integer(evaluation_t, "warmup", "evaluation", 3),
        repeats=repeats,
        kernel_timeout_s=kernel_timeout_s,
        compile_workers=reader.integer(evaluation_t, "compile_workers", "evaluation", None, 1),
        seed=reader.integer(evaluation_t, "seed", "evaluation", 0),
        max_repeats=max_repeats,
        target_precision=_parse_precision(reader, evaluation_t),
        max_measure_s=_parse_duration_key(reader, evaluation_t, "max_measure_time", 1.0),
        l2_flush=reader.choice(evaluation_t, "l2_flush", "evaluation", L2_FLUSH_MODES, "auto"),
        counters=reader.choice(evaluation_t, "counters", "evaluation", COUNTERS_MODES, "none"),
        counters_budget=_parse_share(reader, evaluation_t, "counters_budget", 0.1),
    )
    live = backend == "cuda"

    # -- sizes
    sizes_t = data.get("sizes", {})
    if not isinstance(sizes_t, dict):
        raise reader.fail("sizes", "expected a table [sizes] of name = number")
    for name, value in sizes_t.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise reader.fail(f"sizes.{name}", f"expected a number, got {value!r}")
    sizes: dict[str, int | float] = dict(sizes_t)
    for name, value in size_overrides.items():
        if name not in sizes:
            known = ", ".join(sizes) or "none"
            raise ExperimentError(
                path,
                f"sizes.{name}",
                f"--size {name}: the file has no such size (its sizes: {known})",
            )
        sizes[name] = value

    # -- parameters
    params_t = data.get("parameters", {})
    if not isinstance(params_t, dict):
        raise reader.fail("parameters", "expected a table [parameters] of name = [values]")
    if live and not params_t:
        raise reader.fail("parameters", "missing; expected at least one tuning parameter")
    for name in params_t:
        if name in TOP_LEVEL:
            raise reader.fail(
                f"parameters.{name}",
                f"'{name}' is a top-level key, but TOML put it inside [parameters] because it "
                "follows that header; move it to the top of the file, before the first [table]",
            )
    parameters = {name: _parameter_values(reader, name, spec) for name, spec in params_t.items()}
    clash = sorted(set(parameters) & set(sizes))
    if clash:
        raise reader.fail(f"parameters.{clash[0]}", "is also a problem size; names must differ")
    names = list(sizes) + list(parameters)

    # -- constraints
    raw_constraints = data.get("constraints", [])
    if not isinstance(raw_constraints, list):
        raise reader.fail("constraints", "expected a list of expressions (strings)")
    constraints = []
    for i, text in enumerate(raw_constraints):
        if not isinstance(text, str):
            raise reader.fail(f"constraints[{i}]", f"expected an expression string, got {text!r}")
        reader.expression(text, f"constraints[{i}]", names)
        constraints.append(text)

    # -- kernel, arguments, launch, reference (live backend only; optional on replay)
    kernel = launch = reference = None
    arguments: tuple[ArgumentSpec, ...] = ()
    if live or "kernel" in data:
        kernel_t = reader.table(
            data, "kernel", ("template", "name", "compiler", "options", "arch")
        )
        if "template" not in kernel_t:
            raise reader.fail("kernel.template", "missing; expected the path of a .cu template")
        template = reader.file(kernel_t["template"], "kernel.template")
        options = kernel_t.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise reader.fail("kernel.options", f"expected a list of strings, got {options!r}")
        kernel = KernelSpec(
            template=template,
            name=reader.string(kernel_t, "name", "kernel"),
            compiler=reader.choice(
                kernel_t, "compiler", "kernel", ("auto", "nvrtc", "nvcc"), "auto"
            ),
            options=tuple(options),
            arch=reader.string(kernel_t, "arch", "kernel", None),
        )
        _check_placeholders(reader, kernel.template, parameters, sizes)
    if live or "arguments" in data:
        arguments = _parse_arguments(reader, data.get("arguments"), list(sizes), names)
    if live or "launch" in data:
        launch_t = reader.table(data, "launch", ("grid", "block", "shared_memory"))
        launch = LaunchSpec(
            grid=_dims(reader, launch_t, "grid", names),
            block=_dims(reader, launch_t, "block", names),
            shared_memory=reader.expression(
                launch_t.get("shared_memory", 0), "launch.shared_memory", names
            ),
        )
    if live or "reference" in data:
        ref_t = reader.table(data, "reference", ("function", "rtol"))
        spec = reader.string(ref_t, "function", "reference")
        file_part, _, function = spec.rpartition(":")
        if not file_part or not function.isidentifier():
            raise reader.fail("reference.function", f"expected 'file.py:function', got {spec!r}")
        reference = ReferenceSpec(
            path=reader.file(file_part, "reference.function"),
            function=function,
            rtol=reader.number(ref_t, "rtol", "reference", 1e-5),
        )

    # -- objective
    objective_t = reader.table(data, "objective", ("metric", "flops", "bytes"))
    metric = reader.choice(objective_t, "metric", "objective", tuple(METRICS), "time")
    flops = bytes_ = None
    if "flops" in objective_t:
        flops = reader.expression(objective_t["flops"], "objective.flops", list(sizes))
    if "bytes" in objective_t:
        bytes_ = reader.expression(objective_t["bytes"], "objective.bytes", list(sizes))
    if metric == "GFLOP/s" and flops is None:
        raise reader.fail("objective.flops", "missing; metric 'GFLOP/s' needs a flops expression")
    if metric == "GB/s" and bytes_ is None:
        raise reader.fail("objective.bytes", "missing; metric 'GB/s' needs a bytes expression")
    objective = ObjectiveSpec(metric, flops, bytes_)

    # -- search
    search_t = reader.table(data, "search", ("sampler", "trials", "timeout", "seed", "batch_size"))
    timeout_s = None
    if "timeout" in search_t:
        try:
            timeout_s = parse_duration(search_t["timeout"])
        except ValueError as exc:
            raise reader.fail("search.timeout", str(exc)) from None
    search = SearchSettings(
        sampler=reader.choice(search_t, "sampler", "search", SAMPLERS, "surrogate"),
        trials=reader.integer(search_t, "trials", "search", 100, minimum=1),
        timeout_s=timeout_s,
        seed=reader.integer(search_t, "seed", "search", None),
        batch_size=reader.integer(search_t, "batch_size", "search", 8, minimum=1),
    )

    # -- storage
    storage_t = reader.table(
        data, "storage", ("url", "study", "heartbeat_interval", "grace_period")
    )
    default_url = f"sqlite:///{path.with_suffix('.db')}"
    url = reader.string(storage_t, "url", "storage", default_url)
    if "://" not in url:  # a bare path: relative to the experiment file
        url = str((path.parent / url).resolve())
    beats = {}
    for key, default in (("heartbeat_interval", 10.0), ("grace_period", 60.0)):
        try:
            beats[key] = parse_duration(storage_t.get(key, default))
        except ValueError as exc:
            raise reader.fail(f"storage.{key}", str(exc)) from None
    if beats["grace_period"] <= beats["heartbeat_interval"]:
        raise reader.fail(
            "storage.grace_period",
            f"expected longer than heartbeat_interval ({beats['heartbeat_interval']} s), "
            f"got {beats['grace_period']} s",
        )
    storage = StorageSettings(
        url=url,
        study=reader.string(storage_t, "study", "storage", path.stem),
        heartbeat_interval_s=beats["heartbeat_interval"],
        grace_period_s=beats["grace_period"],
    )

    return Experiment(
        path=path,
        kernel=kernel,
        sizes=sizes,
        arguments=arguments,
        launch=launch,
        parameters=parameters,
        constraints=tuple(constraints),
        objective=objective,
        reference=reference,
        search=search,
        evaluation=evaluation,
        storage=storage,
        notes=tuple(notes),
    )


def _dims(
    reader: _Reader, table: Mapping[str, Any], key: str, names: Sequence[str]
) -> tuple[Expression, ...]:
    raw = table.get(key)
    if not isinstance(raw, list) or not 1 <= len(raw) <= 3:
        raise reader.fail(f"launch.{key}", f"expected a list of 1 to 3 expressions, got {raw!r}")
    return tuple(reader.expression(e, f"launch.{key}", names) for e in raw)


def _check_placeholders(
    reader: _Reader,
    template: Path,
    parameters: Mapping[str, Any],
    sizes: Mapping[str, Any],
) -> None:
    """Every ``${NAME}`` must be a parameter or a size; every parameter must be used."""
    try:
        used = set(Template.from_file(template).placeholders)
    except TemplateError as exc:
        raise reader.fail("kernel.template", str(exc)) from None
    unknown = sorted(used - set(parameters) - set(sizes))
    if unknown:
        raise reader.fail(
            "kernel.template",
            f"{template.name} uses ${{{unknown[0]}}}, which is neither a parameter nor a size; "
            "declare it under [parameters] or [sizes]",
        )
    unused = [name for name in parameters if name not in used]
    if unused:
        raise reader.fail(
            f"parameters.{unused[0]}",
            f"the template {template.name} never uses ${{{unused[0]}}}; "
            "remove the parameter or use it in the template",
        )
