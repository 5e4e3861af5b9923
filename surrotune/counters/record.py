"""Counters for every configuration of a recording: ``surrotune counters``.

A recording that carries counters for every ``ok`` configuration lets the replay benchmark test
counter-informed models without a GPU (issue [counters]; docs/counters.md). This profiles a
recording's configurations on the GPU at hand, with the recording's experiment, one ncu process
per batch (:class:`~surrotune.counters.profiler.NcuProfiler`), and writes the recording again
with each profiled configuration's counters in its Result. It writes after every batch
(atomically), and reads back what an earlier, interrupted call wrote to the same output, so
a long recording is profiled over several calls without losing or repeating any work.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from surrotune.backends.replay import Dataset, load_dataset, save_recording
from surrotune.counters.profiler import counters_attrs
from surrotune.counters.stage import MAX_BATCH, Profiles
from surrotune.errors import SurrotuneError
from surrotune.experiment import Experiment
from surrotune.result import Result

__all__ = [
    "CountersRecordError",
    "RecordSummary",
    "check_device",
    "check_pairing",
    "profile_recording",
    "write_like",
]


class CountersRecordError(SurrotuneError):
    """The recording and the experiment (or this GPU) do not belong together."""


@dataclass
class RecordSummary:
    """What one call did: configurations profiled now, before, and left without counters."""

    profiled: int = 0
    already: int = 0
    missing: int = 0
    seconds: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)
    #: configurations whose launch failed under ncu (each tried once in this call)
    unlaunchable: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        each = f", {self.seconds / self.profiled:.2f} s each" if self.profiled else ""
        text = (
            f"counters: {self.profiled} configurations profiled in {self.seconds:.0f} s{each}; "
            f"{self.already} had counters already; {self.missing} ok ones have none"
        )
        if self.unlaunchable:
            text += f"; {len(self.unlaunchable)} of them failed to launch under ncu"
        return text + (f" (last ncu error: {self.errors[-1]})" if self.errors else "")


def check_pairing(experiment: Experiment, dataset: Dataset) -> None:
    """Refuse a recording of other parameters or other sizes: counters of one configuration
    are only meaningful beside the time the recording holds for it."""
    where = f"{dataset.path}"
    if sorted(experiment.parameters) != sorted(dataset.parameters):
        raise CountersRecordError(
            f"{where}: the recording's parameters {sorted(dataset.parameters)} are not the "
            f"experiment's {sorted(experiment.parameters)} ({experiment.path})"
        )
    differ = dataset.size_differences(experiment.sizes)
    if differ:
        text = ", ".join(f"{k} = {a} (recording: {b})" for k, (a, b) in differ.items())
        raise CountersRecordError(f"{experiment.path}: [sizes] differ from {where}: {text}")


def check_device(dataset: Dataset, device_name: str) -> None:
    """Refuse to profile a recording on another GPU than the one that recorded it."""
    if device_name != dataset.device_name:
        raise CountersRecordError(
            f"{dataset.path} was recorded on {dataset.device_name!r}; this GPU is "
            f"{device_name!r}: its counters would not explain the recorded times"
        )


def write_like(dataset: Dataset, results: Mapping[str, Result], path: Path) -> None:
    """Write ``results`` as a recording with ``dataset``'s header."""
    metadata: dict[str, Any] = {k: v for k, v in dataset.metadata.items() if k != "device"}
    save_recording(
        path,
        list(results.values()),
        parameters=dataset.parameters,
        kernel_name=dataset.kernel_name,
        device=dataset.metadata.get("device") or {"name": dataset.device_name},
        problem_size=dataset.problem_size if isinstance(dataset.problem_size, Mapping) else {},
        objective=dataset.objective,
        direction=dataset.direction,
        constraints=dataset.constraints,
        metadata=metadata,
    )


def profile_recording(
    dataset_path: Path,
    output: Path,
    profiler: Profiles,
    *,
    batch_size: int = MAX_BATCH,
    limit: int | None = None,
    log: Callable[[str], None] | None = None,
) -> RecordSummary:
    """Profile every ``ok`` configuration of the recording at ``dataset_path`` that has no
    counters yet (in ``output`` too, when it exists) and write the recording to ``output``.

    ``limit``: profile at most this many now (the rest on a later call).
    """
    dataset = load_dataset(dataset_path)
    results: dict[str, Result] = dict(dataset.results)
    summary = RecordSummary()
    if output.exists():  # an earlier call's work: kept
        earlier = load_dataset(output)
        for key, result in earlier.results.items():
            if key in results and result.counters and not results[key].counters:
                results[key] = dataclasses.replace(results[key], counters=dict(result.counters))
    todo = [key for key, r in results.items() if r.ok and not r.counters]
    # in a fixed random order: what an interrupted call leaves is a fair sample of the space
    todo = [todo[i] for i in np.random.default_rng(0).permutation(len(todo))]
    summary.already = sum(1 for r in results.values() if r.ok and r.counters)
    if limit is not None:
        todo = todo[: max(limit, 0)]
    started = time.monotonic()
    while todo:
        if profiler.disabled:
            raise CountersRecordError(profiler.disabled)
        keys, todo = todo[:batch_size], todo[batch_size:]
        batch = profiler.profile([dict(results[k].config) for k in keys])
        if batch.error:
            summary.errors.append(batch.error)
        if batch.stopped_at is not None:
            summary.unlaunchable.append(dict(results[keys[batch.stopped_at]].config))
        todo = [keys[i] for i in batch.not_launched()] + todo  # never tried: the next run's
        for key, counters in zip(keys, batch.counters, strict=True):
            if counters is not None:
                results[key] = dataclasses.replace(results[key], counters=counters_attrs(counters))
                summary.profiled += 1
        write_like(dataset, results, output)
        if log is not None:
            done = summary.profiled + summary.already
            log(f"{done} of {sum(r.ok for r in results.values())} ok configurations have "
                f"counters ({batch.seconds:.1f} s for the last {len(keys)})")  # fmt: skip
        if profiler.disabled:
            raise CountersRecordError(profiler.disabled)
    summary.seconds = time.monotonic() - started
    summary.missing = sum(1 for r in results.values() if r.ok and not r.counters)
    if not todo:
        write_like(dataset, results, output)
    return summary
