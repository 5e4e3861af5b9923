"""Why a profiled configuration is slow, in one line, from its counters.

A kernel engineer reads a profile in a fixed order: is it at the DRAM roof (then only moving
fewer bytes helps), does it spill, are the shared-memory accesses conflicting, are there too few
warps to hide latency, is an SM unit saturated, and if none of these, what the warps wait on.
:func:`diagnose` applies that order to the counters of :mod:`surrotune.counters.metrics` and
returns every finding, the first being the one that matters most; the thresholds are the ones
Nsight Compute's own rules use where it has one (60 % of peak for "high" throughput).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DIAGNOSES", "Diagnosis", "diagnose"]

#: the labels, most decisive first
DIAGNOSES = (
    "memory-bound",  # DRAM at the roof
    "register-spills",
    "bank-conflicts",
    "occupancy-limited",
    "compute-bound",
    "latency-bound",
)

DRAM_ROOF = 70.0  # % of peak DRAM throughput that counts as at the roof
HIGH_THROUGHPUT = 60.0  # % of peak: Nsight Compute's "high" utilisation
LOW_OCCUPANCY = 30.0  # % of the SM's warp slots
CONFLICTS_PER_WAVEFRONT = 0.2  # extra shared wavefronts per needed one
SPILL_SHARE = 0.01  # local-memory bytes against DRAM bytes


@dataclass(frozen=True)
class Diagnosis:
    """The findings for one configuration: ``labels`` from :data:`DIAGNOSES`, most decisive
    first, with one sentence each; ``label`` is the first ('' when nothing was readable)."""

    labels: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    evidence: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.labels[0] if self.labels else ""

    def summary(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "no counters to read"

    def to_attrs(self) -> dict[str, object]:
        return {"label": self.label, "labels": list(self.labels), "summary": self.summary()}


def _top_stall(counters: Mapping[str, float]) -> tuple[str, float] | None:
    stalls = {
        name.removeprefix("stall_"): value
        for name, value in counters.items()
        if name.startswith("stall_") and name not in ("stall_not_selected", "stall_selected")
    }
    if not stalls:
        return None
    reason = max(stalls, key=lambda k: stalls[k])
    return reason, stalls[reason]


def diagnose(counters: Mapping[str, float]) -> Diagnosis:
    """Every finding the counters support, most decisive first (see the module docstring)."""
    labels: list[str] = []
    reasons: list[str] = []
    used: dict[str, float] = {}

    def get(name: str) -> float | None:
        value = counters.get(name)
        if value is not None:
            used[name] = float(value)
        return value

    dram = get("dram_throughput")
    if dram is not None and dram >= DRAM_ROOF:
        labels.append("memory-bound")
        reasons.append(f"memory-bound at the DRAM roof ({dram:.0f} % of peak bandwidth)")
    local, dram_bytes = get("local_bytes"), get("dram_bytes")
    if local and local > SPILL_SHARE * max(dram_bytes or 0.0, 1.0):
        labels.append("register-spills")
        registers = get("registers")
        at = f" at {registers:.0f} registers per thread" if registers else ""
        reasons.append(f"register spills: {local / 1e6:.1f} MB of local-memory traffic{at}")
    conflicts, requests = get("shared_bank_conflicts"), get("shared_requests")
    if conflicts and requests and conflicts / requests >= CONFLICTS_PER_WAVEFRONT:
        labels.append("bank-conflicts")
        reasons.append(
            f"shared-memory bank conflicts: {conflicts / requests:.2f} extra wavefronts per "
            "shared access"
        )
    occupancy = get("achieved_occupancy")
    sm, memory = get("sm_throughput"), get("memory_throughput")
    busy = max(v for v in (sm, memory, dram, 0.0) if v is not None)
    if occupancy is not None and occupancy < LOW_OCCUPANCY and busy < HIGH_THROUGHPUT:
        labels.append("occupancy-limited")
        reasons.append(
            f"occupancy-limited: {occupancy:.0f} % of the warp slots active, no unit above "
            f"{busy:.0f} % of its peak"
        )
    if sm is not None and sm >= HIGH_THROUGHPUT and "memory-bound" not in labels:
        labels.append("compute-bound")
        reasons.append(f"compute-bound: the busiest SM unit at {sm:.0f} % of its peak")
    if not labels and used:
        stall = _top_stall(counters)
        labels.append("latency-bound")
        if stall is not None:
            used[f"stall_{stall[0]}"] = stall[1]
            reasons.append(
                f"latency-bound: no unit near its peak ({busy:.0f} %), warps mostly wait on "
                f"{stall[0].replace('_', ' ')} ({stall[1]:.1f} cycles per issue)"
            )
        else:
            reasons.append(f"latency-bound: no unit near its peak ({busy:.0f} %)")
    return Diagnosis(tuple(labels), tuple(reasons), used)
