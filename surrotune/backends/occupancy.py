"""Theoretical occupancy: how many blocks of a compiled kernel fit on one multiprocessor.

A port of NVIDIA's occupancy calculator (``cuda_occupancy.h`` of CUDA 13,
``cudaOccMaxActiveBlocksPerMultiprocessor``) for Volta (sm_70) and newer, the architectures
CUDA 13 compiles for. It runs in the parent process, without a GPU and without a CUDA context:
the backend computes the occupancy of every configuration from the compiler's resource report
and the device limits in the worker's hello, stores it with the trial (failures included) and
refuses a launch that fits zero blocks as ``resource`` before it reaches the driver, with a
message that names the limit.

The header's rules, kept line by line so that the result equals what
``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` answers on the device:

* warps: at most ``maxThreadsPerMultiProcessor / warpSize`` warps per SM, blocks rounded up to
  whole warps;
* registers: allocated per warp in units of 256, split over four SM sub-partitions; the per-block
  check rounds the warps up to a multiple of the four sub-partitions (the hardware's check);
* shared memory: static + dynamic + the driver's reserved bytes per block (1 KB on sm_80+),
  rounded up to the allocation granularity (128 B on sm_80+, 256 B on sm_7x); the SM's carveout
  is the largest configuration by default (228 KB on sm_90) and per-block use is capped by the
  opt-in limit when the kernel opted in;
* blocks: a fixed maximum per SM by architecture (32 on sm_90);
* barriers (sm_90+): named barriers per block against the barriers the SM holds.

The device's shared-memory/L1 carveout preference is the default (-1): surrotune never sets
another. Virtual resources (sm_100+) are not used by kernels compiled from plain CUDA C++, so that
limit never binds and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from surrotune.errors import SurrotuneError

__all__ = [
    "LIMITERS",
    "DeviceLimits",
    "Occupancy",
    "OccupancyError",
    "occupancy",
    "occupancy_arrays",
    "shared_memory_configs",
]

#: the limiting factors, in the order cuda_occupancy.h tests them
LIMITERS = ("warps", "registers", "shared", "blocks", "barriers")

_UNLIMITED = 2**31 - 1  # the header's INT_MAX: "this resource does not limit the kernel"
_KB = 1024


class OccupancyError(SurrotuneError, ValueError):
    """The device is not one the calculator knows (pre-Volta or an unknown compute capability),
    or its properties lack a limit the calculation needs."""


@dataclass(frozen=True)
class DeviceLimits:
    """The device properties the occupancy calculation reads (``cudaOccDeviceProp``)."""

    major: int
    minor: int
    max_threads_per_block: int
    max_threads_per_sm: int
    regs_per_block: int
    regs_per_sm: int
    warp_size: int
    shared_per_block: int
    shared_per_sm: int
    shared_per_block_optin: int
    reserved_shared_per_block: int

    #: cudaDeviceProp name of each field, as the worker's hello reports them
    PROPERTY_NAMES: ClassVar[dict[str, str]] = {
        "major": "major",
        "minor": "minor",
        "max_threads_per_block": "maxThreadsPerBlock",
        "max_threads_per_sm": "maxThreadsPerMultiProcessor",
        "regs_per_block": "regsPerBlock",
        "regs_per_sm": "regsPerMultiprocessor",
        "warp_size": "warpSize",
        "shared_per_block": "sharedMemPerBlock",
        "shared_per_sm": "sharedMemPerMultiprocessor",
        "shared_per_block_optin": "sharedMemPerBlockOptin",
        "reserved_shared_per_block": "reservedSharedMemPerBlock",
    }

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> DeviceLimits:
        """Read the limits from cudaDeviceProp-named properties (the worker's hello).

        ``reservedSharedMemPerBlock`` may be missing from an older hello or a recording; it is
        then the value every driver has used so far (1 KB from sm_80 on, none before), because a
        missing field must not stop the calculation on the GPUs it is best known for.
        """
        values: dict[str, int] = {}
        missing = []
        for field_name, prop in cls.PROPERTY_NAMES.items():
            value = props.get(prop)
            if value is None and prop == "reservedSharedMemPerBlock":
                major = props.get("major")
                value = _KB if isinstance(major, int) and major >= 8 else 0
            if value is None:
                missing.append(prop)
            else:
                values[field_name] = int(value)
        if missing:
            raise OccupancyError(f"the device properties lack {', '.join(missing)}")
        limits = cls(**values)
        _check_supported(limits.major, limits.minor)
        positive = ("max_threads_per_block", "max_threads_per_sm", "regs_per_block",
                    "regs_per_sm", "warp_size", "shared_per_block", "shared_per_sm")  # fmt: skip
        for field_name in positive:
            if getattr(limits, field_name) <= 0:
                raise OccupancyError(
                    f"{cls.PROPERTY_NAMES[field_name]} is {getattr(limits, field_name)}; "
                    "expected a positive number"
                )
        return limits

    @classmethod
    def from_limits(cls, limits: Mapping[str, Any]) -> DeviceLimits:
        """Read the limits from a trial's ``device_limits`` attribute (``runner.device_limits``:
        these fields' own names)."""
        props = {prop: limits[name] for name, prop in cls.PROPERTY_NAMES.items() if name in limits}
        return cls.from_properties(props)

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def arch(self) -> str:
        return f"sm_{self.major}{self.minor}"


# --------------------------------------------------------------------------- architecture tables


def _check_supported(major: int, minor: int) -> None:
    if major < 7 or major > 12:
        raise OccupancyError(
            f"compute capability {major}.{minor} is not covered by the occupancy calculator "
            "(it ports cuda_occupancy.h of CUDA 13 for sm_70 to sm_12x)"
        )
    if (major in (10, 11) and minor not in (0, 1, 3)) or (major == 12 and minor not in (0, 1)):
        raise OccupancyError(
            f"compute capability {major}.{minor} has no known shared-memory configurations"
        )


def _shared_granularity(major: int) -> int:
    """cudaOccSMemAllocationGranularity: bytes in which shared memory is allocated."""
    return 256 if major == 7 else 128


#: cudaOccRegAllocationMaxPerThread (Volta and newer)
_MAX_REGS_PER_THREAD = 256
#: cudaOccRegAllocationGranularity: registers are allocated per warp in units of this many
_REG_GRANULARITY = 256
#: cudaOccSubPartitionsPerMultiprocessor (Volta and newer)
_SUB_PARTITIONS = 4


def _max_blocks_per_sm(major: int, minor: int) -> int:
    """cudaOccMaxBlocksPerMultiprocessor."""
    if major == 7:
        return 16 if minor == 5 else 32
    if major == 8:
        return {0: 32, 9: 24}.get(minor, 16)
    if major == 9:
        return 32
    if major == 10:
        return 24 if minor == 1 else 32
    if major == 11:
        return 24 if minor == 0 else 32
    return 24  # 12


def shared_memory_configs(major: int, minor: int) -> tuple[int, ...]:
    """The shared-memory sizes an SM can be carved out to, in bytes (smallest first).

    cudaOccAlignUpShmemSizeVoltaPlus: the SM's shared memory is one of these, the smallest that
    holds what is asked.
    """
    _check_supported(major, minor)
    if major == 7:
        sizes_kb = (32, 64) if minor == 5 else (0, 8, 16, 32, 64, 96)
    elif major == 8:
        sizes_kb = (
            (0, 8, 16, 32, 64, 100, 132, 164) if minor in (0, 7) else (0, 8, 16, 32, 64, 100)
        )
    elif major in (9, 10, 11):
        sizes_kb = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
    else:  # 12
        sizes_kb = (0, 8, 16, 32, 64, 100)
    return tuple(size * _KB for size in sizes_kb)


def _align_up_shared(size: int, major: int, minor: int) -> int | None:
    """The carveout that holds ``size`` bytes, or None when none does (INVALID_INPUT)."""
    for config in shared_memory_configs(major, minor):
        if size <= config:
            return config
    return None


def _barriers_per_sm(block_limit: int, major: int, minor: int) -> int:
    """cudaOccMaxBlocksPerSMBlockBarrierLimit: named barriers an SM holds."""
    single = (major == 8 and minor != 0) or (major == 10 and minor == 1)
    single = single or (major == 11 and minor == 0) or major == 12
    return block_limit if single else 2 * block_limit


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# --------------------------------------------------------------------------- the calculation


@dataclass(frozen=True)
class Occupancy:
    """How many blocks fit on one SM, and what stops more from fitting.

    ``block_limits`` holds, per limiting factor (:data:`LIMITERS`), how many blocks that factor
    alone allows (``2**31 - 1`` when it does not limit); ``limiters`` names every factor whose
    limit equals the result, as the header's ``limitingFactors`` bit field does.
    """

    active_blocks_per_sm: int
    threads_per_block: int
    max_warps_per_sm: int
    warps_per_block: int
    block_limits: Mapping[str, int]
    limiters: tuple[str, ...]
    registers_per_block: int  # allocated: per-warp granularity times warps
    shared_per_block: int  # allocated: static + dynamic + reserved, rounded up
    shared_per_sm: int  # the carveout the blocks run under
    detail: Mapping[str, str]  # why each factor allows what it allows, for messages

    @property
    def active_warps_per_sm(self) -> int:
        return self.active_blocks_per_sm * self.warps_per_block

    @property
    def fraction(self) -> float:
        """Theoretical occupancy: active warps over the SM's maximum, 0 to 1."""
        return self.active_warps_per_sm / self.max_warps_per_sm

    @property
    def limiter(self) -> str:
        """The limiting factors joined with ``+`` (``"registers"``, ``"warps+blocks"``)."""
        return "+".join(self.limiters)

    @property
    def fits(self) -> bool:
        return self.active_blocks_per_sm > 0

    def explain(self) -> str:
        """Why not a single block fits (or what limits the occupancy, when some do)."""
        reasons = [self.detail[name] for name in self.limiters if name in self.detail]
        prefix = (
            "no block fits on a multiprocessor"
            if not self.fits
            else f"{self.active_blocks_per_sm} blocks per multiprocessor"
        )
        return f"{prefix}: {'; '.join(reasons)}" if reasons else prefix


def occupancy(
    limits: DeviceLimits,
    *,
    registers: int,
    threads: int,
    static_shared: int = 0,
    dynamic_shared: int = 0,
    barriers: int = 1,
    max_dynamic_shared: int | None = None,
    carveout: int = -1,
) -> Occupancy:
    """The occupancy of one launch: ``cudaOccMaxActiveBlocksPerMultiprocessor``.

    Args:
        limits: the device.
        registers: registers per thread of the compiled kernel.
        threads: threads per block.
        static_shared: the kernel's static shared memory per block, bytes.
        dynamic_shared: the launch's dynamic shared memory per block, bytes.
        barriers: named barriers the kernel uses (ptxas "used N barriers"; 0 without
            ``__syncthreads``).
        max_dynamic_shared: the kernel's ``cudaFuncAttributeMaxDynamicSharedMemorySize``. None
            means what surrotune's worker sets: the dynamic size itself when static + dynamic
            exceed the default per-block limit (the opt-in), else the driver's default,
            ``sharedMemPerBlock`` minus the static size.
        carveout: the shared-memory carveout preference in percent, -1 for the default.
    """
    if threads <= 0:
        raise OccupancyError(f"threads per block must be positive, got {threads}")
    if registers < 0 or static_shared < 0 or dynamic_shared < 0:
        raise OccupancyError("registers and shared memory sizes must not be negative")
    if not -1 <= carveout <= 100:
        raise OccupancyError(f"carveout must be -1 or 0..100 percent, got {carveout}")
    major, minor = limits.major, limits.minor
    _check_supported(major, minor)
    warp = limits.warp_size
    warps = -(-threads // warp)
    detail: dict[str, str] = {}
    block_limits: dict[str, int] = {}

    # -- warps (cudaOccMaxBlocksPerSMWarpsLimit)
    max_warps = limits.max_warps_per_sm
    if threads > limits.max_threads_per_block:
        block_limits["warps"] = 0
        detail["warps"] = (
            f"{threads} threads per block exceed maxThreadsPerBlock {limits.max_threads_per_block}"
        )
    else:
        block_limits["warps"] = max_warps // warps
        detail["warps"] = f"{warps} warps per block, {max_warps} warps per multiprocessor"

    # -- registers (cudaOccMaxBlocksPerSMRegsLimit)
    per_warp = _round_up(registers * warp, _REG_GRANULARITY)
    per_block = per_warp * warps
    assumed = per_warp * _round_up(warps, _SUB_PARTITIONS)  # the hardware's per-block check
    if registers > _MAX_REGS_PER_THREAD:
        block_limits["registers"] = 0
        detail["registers"] = (
            f"{registers} registers per thread exceed the maximum of {_MAX_REGS_PER_THREAD}"
        )
    elif limits.regs_per_block < assumed or limits.regs_per_block < per_block:
        block_limits["registers"] = 0
        detail["registers"] = (
            f"{registers} registers per thread take {per_warp} per warp (allocated in units "
            f"of {_REG_GRANULARITY}); {warps} warps per block, counted as "
            f"{_round_up(warps, _SUB_PARTITIONS)} over {_SUB_PARTITIONS} sub-partitions, need "
            f"{max(assumed, per_block)}, over regsPerBlock {limits.regs_per_block}"
        )
    elif per_warp > 0:
        warps_per_partition = (limits.regs_per_sm // _SUB_PARTITIONS) // per_warp
        block_limits["registers"] = warps_per_partition * _SUB_PARTITIONS // warps
        detail["registers"] = (
            f"{registers} registers per thread ({per_warp} per warp) leave room for "
            f"{warps_per_partition * _SUB_PARTITIONS} warps in regsPerMultiprocessor "
            f"{limits.regs_per_sm}"
        )
    else:
        block_limits["registers"] = _UNLIMITED

    # -- blocks (cudaOccMaxBlocksPerMultiprocessor)
    max_blocks = _max_blocks_per_sm(major, minor)
    block_limits["blocks"] = max_blocks
    detail["blocks"] = f"at most {max_blocks} blocks per multiprocessor on {limits.arch}"

    # -- shared memory (cudaOccMaxBlocksPerSMSmemLimit)
    granularity = _shared_granularity(major)
    preference = limits.shared_per_sm if carveout == -1 else carveout * limits.shared_per_sm // 100
    preference_aligned = _align_up_shared(preference, major, minor)
    if preference_aligned is None:
        raise OccupancyError(
            f"sharedMemPerMultiprocessor {limits.shared_per_sm} is larger than any carveout "
            f"of {limits.arch}"
        )
    reserved = limits.reserved_shared_per_block
    static_total = static_shared + reserved
    allocated = _round_up(static_total + dynamic_shared, granularity)
    if max_dynamic_shared is None:
        if static_shared + dynamic_shared > limits.shared_per_block:
            max_dynamic_shared = dynamic_shared
        else:
            max_dynamic_shared = max(0, limits.shared_per_block - static_shared)
    max_usage = static_total + max_dynamic_shared
    # the kernel attributes as cudaFuncGetAttributes gives them use the opt-in limit config
    per_block_limit = (
        limits.shared_per_block_optin
        if max_usage > limits.shared_per_block
        else limits.shared_per_block
    )
    if major >= 8:
        per_block_limit += reserved
    shared_per_sm = preference_aligned
    if dynamic_shared > max_dynamic_shared:
        block_limits["shared"] = 0
        detail["shared"] = (
            f"{dynamic_shared} bytes of dynamic shared memory exceed the kernel's maximum "
            f"dynamic shared size of {max_dynamic_shared}"
        )
    elif allocated > per_block_limit:
        block_limits["shared"] = 0
        detail["shared"] = (
            f"{static_shared} static + {dynamic_shared} dynamic + {reserved} reserved bytes "
            f"of shared memory per block (allocated: {allocated}) exceed the per-block limit of "
            f"{per_block_limit}"
        )
    else:
        if preference_aligned < allocated:
            aligned = _align_up_shared(allocated, major, minor)
            if aligned is None:  # cannot happen below the per-block limit; the header errs
                raise OccupancyError(
                    f"{allocated} bytes of shared memory per block fit no carveout"
                )
            shared_per_sm = aligned
        block_limits["shared"] = shared_per_sm // allocated if allocated > 0 else _UNLIMITED
        detail["shared"] = (
            f"{allocated} bytes of shared memory per block ({static_shared} static + "
            f"{dynamic_shared} dynamic + {reserved} reserved, in units of {granularity}) in "
            f"{shared_per_sm} per multiprocessor"
        )

    limit = min(block_limits["warps"], block_limits["registers"], block_limits["shared"],
                block_limits["blocks"])  # fmt: skip
    limiters = [name for name in ("warps", "registers", "shared", "blocks")
                if block_limits[name] == limit]  # fmt: skip

    # -- barriers (cudaOccMaxBlocksPerSMBlockBarrierLimit, Hopper onwards)
    if major >= 9 and barriers > 0:
        available = _barriers_per_sm(max_blocks, major, minor)
        block_limits["barriers"] = available // barriers
        detail["barriers"] = (
            f"{barriers} barriers per block, {available} barriers per multiprocessor"
        )
        limit = min(limit, block_limits["barriers"])
        if block_limits["barriers"] == limit:
            limiters = [name for name in limiters if block_limits[name] == limit]
            limiters.append("barriers")
    else:
        block_limits["barriers"] = _UNLIMITED

    return Occupancy(
        active_blocks_per_sm=limit,
        threads_per_block=threads,
        max_warps_per_sm=max_warps,
        warps_per_block=warps,
        block_limits=block_limits,
        limiters=tuple(limiters),
        registers_per_block=per_block,
        shared_per_block=allocated,
        shared_per_sm=shared_per_sm,
        detail=detail,
    )


def occupancy_arrays(
    limits: DeviceLimits, registers: np.ndarray, threads: np.ndarray, static_shared: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Theoretical occupancy (0 to 1) and active blocks per multiprocessor of many launches at
    once, by :func:`occupancy` itself: the sampler scores tens of thousands of candidates whose
    *predicted* resources (rounded here to whole registers, threads and bytes) take far fewer
    distinct values, so each distinct triple is computed once. A launch that cannot run (too
    many threads, registers or bytes) has occupancy 0 and no blocks."""
    triples = np.column_stack([
        np.clip(np.ceil(np.asarray(registers, dtype=np.float64)), 0, _MAX_REGS_PER_THREAD + 1),
        np.clip(np.rint(np.asarray(threads, dtype=np.float64)), 1, 2**20),
        np.clip(np.rint(np.asarray(static_shared, dtype=np.float64)), 0, 2**30),
    ]).astype(np.int64)  # fmt: skip
    unique, inverse = np.unique(triples, axis=0, return_inverse=True)
    fraction = np.empty(len(unique))
    blocks = np.empty(len(unique))
    for k, (r, t, s) in enumerate(unique):
        result = occupancy(limits, registers=int(r), threads=int(t), static_shared=int(s))
        fraction[k], blocks[k] = result.fraction, result.active_blocks_per_sm
    inverse = inverse.reshape(-1)
    return fraction[inverse], blocks[inverse]
