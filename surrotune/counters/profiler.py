"""Profile a batch of configurations with one ncu process; counters per configuration.

:class:`NcuProfiler` rebuilds each configuration's launch exactly as the cuda backend compiled
and launched it (:func:`surrotune.backends.sanitize.rebuild_launch`: the same cubin, from the
backend's compile cache), pickles the batch for :mod:`surrotune.counters.target`, runs ncu over
it once, and maps the n-th profiled launch to the n-th configuration. It measures what that
cost, per configuration, so that the policy can keep profiling within its budget.

Where ncu is missing or cannot read the counters (no permission, an unsupported GPU), the first
batch says so with the reason, :attr:`NcuProfiler.disabled` keeps it, and the run goes on.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from surrotune.counters.metrics import COUNTERS, counters_from_metrics, ncu_metrics
from surrotune.counters.ncu import find_ncu, ncu_failure, parse_ncu_csv, run_ncu
from surrotune.result import ParamValue

if TYPE_CHECKING:
    from surrotune.backends.cuda import CudaBackend

__all__ = ["NcuProfiler", "ProfileBatch", "counters_attrs"]


@dataclass
class ProfileBatch:
    """What one ncu run gave: counters per configuration (None where that one got none),
    the wall time, and the error that stopped it ('' when none).

    ``stopped_at``: the configuration whose launch ended the run early (the target stops at a
    failed launch: a sticky CUDA error ends its context), or None. The ones after it were
    never launched; a caller profiles them again in another run, so one configuration that
    cannot run under ncu costs itself, not the rest of its batch.
    """

    counters: list[dict[str, float] | None] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    stopped_at: int | None = None

    def not_launched(self) -> list[int]:
        """The configurations after :attr:`stopped_at`: never launched, so never tried."""
        if self.stopped_at is None:
            return []
        return list(range(self.stopped_at + 1, len(self.counters)))

    @property
    def profiled(self) -> int:
        return sum(c is not None for c in self.counters)

    @property
    def seconds_per_config(self) -> float | None:
        return self.seconds / self.profiled if self.profiled else None


class NcuProfiler:
    """Profiles configurations of a :class:`~surrotune.backends.cuda.CudaBackend`'s experiment.

    Args:
        backend: the backend that measured them (experiment, compiler and cache, GPU).
        executable: ncu (None: :func:`surrotune.counters.ncu.find_ncu`).
        metrics: ncu metric names (default: those of :data:`surrotune.counters.metrics.COUNTERS`).
        timeout_s: how long one ncu run over a batch may take.
        report_dir: where ncu's CSV and output of each batch are kept (None: not kept).
    """

    def __init__(
        self,
        backend: CudaBackend,
        *,
        executable: str | None = None,
        metrics: Sequence[str] | None = None,
        timeout_s: float = 900.0,
        report_dir: Path | None = None,
    ) -> None:
        self.backend = backend
        self.executable = executable or find_ncu()
        self.metrics = list(metrics) if metrics is not None else ncu_metrics(COUNTERS)
        self.timeout_s = timeout_s
        self.report_dir = report_dir
        self.disabled = "" if self.executable else "ncu (Nsight Compute) was not found"
        self.batches = 0

    def profile(self, configs: Sequence[Mapping[str, ParamValue]]) -> ProfileBatch:
        """Counters for each of ``configs`` (in order), from one ncu run."""
        if self.disabled or not configs:
            return ProfileBatch([None] * len(configs), error=self.disabled)
        from surrotune.backends.sanitize import SanitizeJob, rebuild_launches

        jobs, index = [], []
        for i, job in enumerate(rebuild_launches(self.backend, configs)):
            if isinstance(job, SanitizeJob):  # else never measured ok: nothing to profile
                jobs.append(job)
                index.append(i)
        batch = ProfileBatch([None] * len(configs))
        if not jobs:
            return batch
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="surrotune-ncu-") as scratch:
            job_path, csv_path = Path(scratch) / "jobs.pickle", Path(scratch) / "ncu.csv"
            job_path.write_bytes(pickle.dumps(jobs))
            assert self.executable is not None
            code, output, text = run_ncu(
                self.executable, self.metrics, job_path, csv_path, timeout_s=self.timeout_s
            )
        batch.seconds = time.monotonic() - started
        self.batches += 1
        self._keep(output, text)
        launches = []
        if text.strip():
            try:
                launches = parse_ncu_csv(text)
            except ValueError:
                launches = []
        if not launches:
            reason = ncu_failure(output) or ncu_failure(text)
            if code is None:
                batch.error = f"ncu did not finish within {self.timeout_s:.0f} s"
            else:
                batch.error = reason or f"ncu wrote no counters (exit code {code})"
                if reason is not None:  # a reason that no other batch would escape
                    self.disabled = f"counters are off: {reason}"
            return batch
        # ncu writes a row for the launch that failed, every metric n/a, and the target then
        # stops: that launch, not the next, is the one that cannot run under ncu
        stopped: int | None = len(launches) if len(launches) < len(jobs) else None
        for n, (position, launch) in enumerate(zip(index, launches, strict=False)):
            counters = counters_from_metrics(launch.metrics)
            if not counters:
                stopped = n
                break
            batch.counters[position] = counters
        if stopped is not None:
            batch.stopped_at = index[stopped]
            batch.error = (
                f"ncu profiled {stopped} of {len(jobs)} launches: the launch of "
                f"{_describe(configs[batch.stopped_at])} failed under ncu"
            )
        return batch

    def _keep(self, output: str, text: str) -> None:
        if self.report_dir is None:
            return
        self.report_dir.mkdir(parents=True, exist_ok=True)
        stem = self.report_dir / f"ncu-batch-{self.batches}"
        stem.with_suffix(".csv").write_text(text)
        stem.with_suffix(".log").write_text(output)


def _describe(config: Mapping[str, ParamValue]) -> str:
    return " ".join(f"{name}={value}" for name, value in config.items())


def counters_attrs(counters: Mapping[str, float]) -> dict[str, Any]:
    """The counters as a trial stores them (rounded: 6 significant digits are plenty)."""
    return {name: float(f"{value:.6g}") for name, value in counters.items()}
