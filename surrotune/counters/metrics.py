"""The hardware counters surrotune reads, by name: which Nsight Compute metrics make each one.

A time says *that* a configuration is slow; these say *why*: whether it streams DRAM at the
roof, runs few warps, conflicts on shared-memory banks, spills registers, or waits (and on
what). Each counter is one ncu metric, or a sum of a few (loads and stores of the same traffic),
named the way the diagnosis and the sampler's features read them. The set is small on purpose:
ncu replays a kernel once per group of metrics it cannot collect together, and each replay costs
a launch, so every metric here is one the diagnosis uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["COUNTERS", "STALL_REASONS", "Counter", "counters_from_metrics", "ncu_metrics"]


@dataclass(frozen=True)
class Counter:
    """One counter: the sum of ``metrics`` (ncu names), in ``unit``."""

    name: str
    metrics: tuple[str, ...]
    unit: str
    meaning: str


#: warp stall reasons whose share of issue cycles is read (ncu's WarpStateStats names)
STALL_REASONS = (
    "long_scoreboard",  # waiting on global/local memory (L1TEX)
    "short_scoreboard",  # waiting on shared memory or MUFU
    "barrier",  # waiting at __syncthreads
    "mio_throttle",  # memory input/output queue full (shared memory, special math)
    "lg_throttle",  # local/global queue full
    "math_pipe_throttle",  # an arithmetic pipe is busy
    "wait",  # fixed-latency dependency
    "not_selected",  # ready, another warp was picked (plenty of parallelism)
    "membar",  # waiting on a memory barrier
    "branch_resolving",
    "no_instruction",  # instruction cache miss
    "dispatch_stall",
)

COUNTERS: tuple[Counter, ...] = (
    Counter(
        "achieved_occupancy",
        ("sm__warps_active.avg.pct_of_peak_sustained_active",),
        "%",
        "active warps per SM over the maximum, averaged while the SM is active",
    ),
    Counter(
        "sm_throughput",
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
        "%",
        "the busiest SM unit's throughput, % of its peak",
    ),
    Counter(
        "dram_throughput",
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed",),
        "%",
        "DRAM bandwidth used, % of the peak",
    ),
    Counter(
        "memory_throughput",
        ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
        "%",
        "the busiest memory unit's throughput (L1, L2, DRAM), % of its peak",
    ),
    Counter("l1_hit_rate", ("l1tex__t_sector_hit_rate.pct",), "%", "L1/TEX sector hit rate"),
    Counter("l2_hit_rate", ("lts__t_sector_hit_rate.pct",), "%", "L2 sector hit rate"),
    Counter(
        "shared_bank_conflicts",
        (
            "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
            "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        ),
        "conflicts",
        "shared-memory bank conflicts (extra wavefronts), loads and stores",
    ),
    Counter(
        "shared_requests",
        (
            "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        ),
        "wavefronts",
        "shared-memory wavefronts, loads and stores (the denominator of the conflict rate)",
    ),
    Counter(
        "local_bytes",
        (
            "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
        ),
        "byte",
        "local-memory traffic (register spills, stack arrays), loads and stores",
    ),
    Counter("dram_bytes", ("dram__bytes_read.sum", "dram__bytes_write.sum"), "byte", "DRAM bytes"),
    Counter("registers", ("launch__registers_per_thread",), "register", "registers per thread"),
    Counter("duration_ns", ("gpu__time_duration.sum",), "ns", "the profiled launch's duration"),
    *(
        Counter(
            f"stall_{reason}",
            (f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio",),
            "ratio",
            f"warps stalled on {reason.replace('_', ' ')}, per issued instruction",
        )
        for reason in STALL_REASONS
    ),
)


def ncu_metrics(counters: tuple[Counter, ...] = COUNTERS) -> list[str]:
    """The ncu metric names to collect for ``counters``, each once, in a stable order."""
    return list(dict.fromkeys(metric for counter in counters for metric in counter.metrics))


def counters_from_metrics(
    metrics: Mapping[str, float | None], counters: tuple[Counter, ...] = COUNTERS
) -> dict[str, float]:
    """Our counters from one launch's ncu metrics: a counter whose metrics are all missing (or
    n/a on this GPU) is left out, one with some present sums those."""
    out: dict[str, float] = {}
    for counter in counters:
        values = [metrics.get(metric) for metric in counter.metrics]
        present = [float(v) for v in values if v is not None]
        if present:
            out[counter.name] = sum(present)
    return out
