"""The Result record and the Status taxonomy: the one vocabulary every module speaks.

Backends produce a :class:`Result` for each configuration they evaluate, the runner stores it in
the Optuna storage (``ok`` as a COMPLETE trial, anything else as FAIL), the sampler learns from
it and analysis reads it back. The user-attribute names written to the storage are defined here,
once, in :data:`USER_ATTRS`, and documented in ``docs/trials.md``.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["USER_ATTRS", "ParamValue", "Result", "Status"]

ParamValue = int | float | str | bool


class Status(enum.StrEnum):
    """Why a configuration has the outcome it has (DESIGN.md: "the failure taxonomy")."""

    OK = "ok"
    COMPILE = "compile"
    RESOURCE = "resource"
    LAUNCH = "launch"
    RUNTIME = "runtime"
    TIMEOUT = "timeout"
    CORRECTNESS = "correctness"
    CONSTRAINT = "constraint"

    @property
    def is_failure(self) -> bool:
        return self is not Status.OK

    @property
    def counts_as_evaluation(self) -> bool:
        """A configuration that breaks a known constraint was never compiled: it costs nothing."""
        return self is not Status.CONSTRAINT


#: user-attribute name -> what it holds (the single documentation source for docs/trials.md)
USER_ATTRS: dict[str, str] = {
    "status": "ok, compile, resource, launch, runtime, timeout, correctness or constraint",
    "objective": "the objective in its own unit (ms, GB/s or GFLOP/s); null unless ok",
    "time_ms": "median kernel time in milliseconds over the timed repeats; null unless timed",
    "times_ms": "every timed repeat, in milliseconds, in the order measured",
    "compile_time_ms": "wall time to compile this configuration, ms (recorded value on replay)",
    "benchmark_time_ms": "wall time spent verifying and timing this configuration, ms",
    "registers": "registers per thread from the compiled kernel",
    "shared_bytes": "shared memory per block, static plus dynamic, bytes",
    "local_bytes": "local memory per thread (stack frame and spills), bytes",
    "threads_per_block": "threads per block of the launch",
    "occupancy": "theoretical occupancy: active warps per SM over the SM's maximum, 0 to 1",
    "active_blocks_per_sm": "blocks of this launch that fit on one SM at once (0: cannot run)",
    "occupancy_limiter": "what limits active_blocks_per_sm: warps, registers, shared, blocks or "
    "barriers (several joined with +)",
    "timing_precision": "relative half-width of the 95 % interval of the median time",
    "timing_stop": "why timing stopped: repeats, precision, max_repeats or max_measure_time",
    "l2_flush": "whether the L2 cache was flushed before each timed launch",
    "sm_clock_mhz": "SM clock while timing, MHz (NVML or nvidia-smi)",
    "memory_clock_mhz": "memory clock while timing, MHz",
    "gpu_temperature_c": "GPU temperature while timing, degrees Celsius",
    "gpu_power_w": "board power draw while timing, W",
    "error": "the compiler's, driver's or verifier's message; empty when ok",
    "verification_error": "relative L2 error of the outputs against the reference",
    "counters": "hardware counters by metric name, when profiled",
    "config_key": "stable key of the configuration (values joined by commas, parameter order)",
}


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Result:
    """The outcome of evaluating one configuration.

    ``objective`` is set exactly when ``status`` is ``ok``. Times are in milliseconds.
    """

    config: Mapping[str, ParamValue]
    status: Status
    objective: float | None = None
    times_ms: tuple[float, ...] = ()
    compile_time_ms: float | None = None
    benchmark_time_ms: float | None = None
    registers: int | None = None
    shared_bytes: int | None = None
    local_bytes: int | None = None
    threads_per_block: int | None = None
    error: str = ""
    verification_error: float | None = None
    counters: Mapping[str, float] = field(default_factory=dict)
    occupancy: float | None = None
    active_blocks_per_sm: int | None = None
    occupancy_limiter: str = ""
    timing_precision: float | None = None
    timing_stop: str = ""
    l2_flush: bool | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    gpu_temperature_c: float | None = None
    gpu_power_w: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "times_ms", tuple(float(t) for t in self.times_ms))
        objective = _finite_or_none(self.objective)
        if self.status is Status.OK and objective is None:
            raise ValueError(f"an ok Result needs a finite objective, got {self.objective!r}")
        if self.status is not Status.OK:
            objective = None
        object.__setattr__(self, "objective", objective)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def time_ms(self) -> float | None:
        """The median of the timed repeats."""
        return statistics.median(self.times_ms) if self.times_ms else None

    def config_key(self, order: list[str] | None = None) -> str:
        names = order if order is not None else list(self.config)
        return ",".join(str(self.config[name]) for name in names)

    def to_user_attrs(self, order: list[str] | None = None) -> dict[str, Any]:
        """The Result as JSON-serialisable user attributes; names as in :data:`USER_ATTRS`."""
        return {
            "status": self.status.value,
            "objective": self.objective,
            "time_ms": self.time_ms,
            "times_ms": list(self.times_ms),
            "compile_time_ms": self.compile_time_ms,
            "benchmark_time_ms": self.benchmark_time_ms,
            "registers": self.registers,
            "shared_bytes": self.shared_bytes,
            "local_bytes": self.local_bytes,
            "threads_per_block": self.threads_per_block,
            "error": self.error,
            "verification_error": _finite_or_none(self.verification_error),
            "counters": dict(self.counters),
            "config_key": self.config_key(order),
            "occupancy": self.occupancy,
            "active_blocks_per_sm": self.active_blocks_per_sm,
            "occupancy_limiter": self.occupancy_limiter,
            "timing_precision": _finite_or_none(self.timing_precision),
            "timing_stop": self.timing_stop,
            "l2_flush": self.l2_flush,
            "sm_clock_mhz": self.sm_clock_mhz,
            "memory_clock_mhz": self.memory_clock_mhz,
            "gpu_temperature_c": self.gpu_temperature_c,
            "gpu_power_w": self.gpu_power_w,
        }

    @classmethod
    def from_user_attrs(cls, config: Mapping[str, ParamValue], attrs: Mapping[str, Any]) -> Result:
        """Rebuild a Result from a stored trial's params and user attributes.

        A FAIL trial without a ``status`` attribute (written by someone else) is a generic
        ``runtime`` failure.
        """
        status = Status(attrs.get("status", Status.RUNTIME.value))
        return cls(
            config=dict(config),
            status=status,
            objective=attrs.get("objective"),
            times_ms=tuple(attrs.get("times_ms") or ()),
            compile_time_ms=attrs.get("compile_time_ms"),
            benchmark_time_ms=attrs.get("benchmark_time_ms"),
            registers=attrs.get("registers"),
            shared_bytes=attrs.get("shared_bytes"),
            local_bytes=attrs.get("local_bytes"),
            threads_per_block=attrs.get("threads_per_block"),
            error=attrs.get("error", ""),
            verification_error=attrs.get("verification_error"),
            counters=dict(attrs.get("counters") or {}),
            occupancy=attrs.get("occupancy"),
            active_blocks_per_sm=attrs.get("active_blocks_per_sm"),
            occupancy_limiter=attrs.get("occupancy_limiter", ""),
            timing_precision=attrs.get("timing_precision"),
            timing_stop=attrs.get("timing_stop", ""),
            l2_flush=attrs.get("l2_flush"),
            sm_clock_mhz=attrs.get("sm_clock_mhz"),
            memory_clock_mhz=attrs.get("memory_clock_mhz"),
            gpu_temperature_c=attrs.get("gpu_temperature_c"),
            gpu_power_w=attrs.get("gpu_power_w"),
        )

    def to_record(self) -> dict[str, Any]:
        """The Result as a row of a surrotune recording (see backends/replay.py)."""
        record = self.to_user_attrs()
        record.pop("config_key")
        record["config"] = dict(self.config)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Result:
        return cls.from_user_attrs(record["config"], record)
