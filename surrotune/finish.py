"""The end of a run, between the last trial and the summary: check the winner before reporting it.

Two checks, each skipped where the backend cannot do it:

1. ``--sanitize best|all|none`` (default ``best``): compute-sanitizer memcheck and racecheck on
   the best configuration; a finding demotes it and the next best is checked
   (:mod:`surrotune.backends.sanitize`). Only the cuda backend has a sanitizer; where
   compute-sanitizer is not installed the summary says so once and the run goes on.
2. ``--remeasure K`` (default 5, 0 to skip): the top K configurations measured again in
   interleaved rounds, and whether the winner held (:mod:`surrotune.backends.remeasure`).

3. ``[evaluation] counters = elite|failures|all`` (default ``none``): Nsight Compute counters
   on the configurations the policy chooses, within ``counters_budget`` of the run's wall time,
   each with its diagnosis (:mod:`surrotune.counters`). Where ncu is missing or may not read
   the counters, the summary says why, once.

Sanitizing comes first, so that the re-measurement compares configurations that passed it;
profiling comes last, so that it disturbs no timing. None changes a trial: verdicts are study
attributes (:mod:`surrotune.verdicts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna

from surrotune.backends.base import Backend
from surrotune.backends.remeasure import (
    Remeasures,
    ReplayRemeasurer,
    remeasure_top,
    remeasurer_for,
)
from surrotune.backends.sanitize import (
    MODES,
    CudaSanitizer,
    Sanitizes,
    find_compute_sanitizer,
    format_sanitize,
    sanitize_trials,
)
from surrotune.counters.policy import CountersMode, CountersPolicy
from surrotune.counters.stage import Profiles, profile_study
from surrotune.errors import SurrotuneError
from surrotune.storage import storage_url

__all__ = ["FinishSettings", "finish_run", "profiler_for", "report_dir_for", "sanitizer_for"]

#: what the summary says, once, when the cuda backend could sanitize but the tool is missing
MISSING_SANITIZER = (
    "compute-sanitizer was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, the "
    "nvidia-cuda-sanitizer-api wheel): the winner is reported without memcheck and racecheck. "
    "Install the CUDA toolkit's compute-sanitizer, or pass --sanitize none to skip the check."
)


@dataclass(frozen=True)
class FinishSettings:
    """What the end of a run does; the command line's ``--sanitize``, ``--remeasure`` and
    ``--remeasure-rounds``."""

    sanitize: str = "best"
    remeasure_top: int = 5
    remeasure_rounds: int = 10
    sanitizer_timeout_s: float = 600.0
    max_findings: int = 10

    def __post_init__(self) -> None:
        if self.sanitize not in MODES:
            raise ValueError(f"sanitize must be one of {', '.join(MODES)}; got {self.sanitize!r}")
        if self.remeasure_top == 1 or self.remeasure_top < 0 or self.remeasure_rounds < 1:
            raise ValueError(
                "remeasure_top must be 0 (off) or at least 2, and remeasure_rounds at least 1; "
                f"got {self.remeasure_top} and {self.remeasure_rounds}"
            )


def report_dir_for(storage: str, study_name: str) -> Path:
    """Where sanitizer reports go: beside a file storage (``runs.db`` ->
    ``runs-sanitizer/``), else ``surrotune-sanitizer/`` in the working directory."""
    url = storage_url(storage)
    for scheme in ("sqlite:///", "journal:///"):
        path = Path(url.removeprefix(scheme))
        if url.startswith(scheme) and not path.name.startswith(":"):  # not sqlite's :memory:
            return path.parent / f"{path.stem}-sanitizer"
    return Path.cwd() / "surrotune-sanitizer"


def sanitizer_for(
    backend: Backend, report_dir: Path, settings: FinishSettings
) -> tuple[Sanitizes | None, str]:
    """The sanitizer for ``backend`` and, when there is none although there could be, why."""
    from surrotune.backends.cuda import CudaBackend

    if not isinstance(backend, CudaBackend):
        return None, ""  # nothing runs on a GPU: nothing to sanitize
    executable = find_compute_sanitizer()
    if executable is None:
        return None, MISSING_SANITIZER
    sanitizer = CudaSanitizer(
        backend, report_dir, executable=executable, timeout_s=settings.sanitizer_timeout_s
    )
    return sanitizer, ""


def finish_run(
    study: optuna.Study,
    backend: Backend,
    settings: FinishSettings,
    *,
    report_dir: Path,
    sanitizer: Sanitizes | None = None,
    remeasurer: Remeasures | None = None,
    counters: CountersPolicy | None = None,
    profiler: Profiles | None = None,
    run_wall_s: float = 0.0,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Run the end-of-run checks on ``study`` with ``backend``; returns the summary's lines.

    ``sanitizer`` and ``remeasurer`` default to what :func:`sanitizer_for` and
    :func:`~surrotune.backends.remeasure.remeasurer_for` find for the backend. A check that
    fails (the worker cannot start, nvcc is gone) is reported in the lines; the trials are
    stored already and nothing is lost.
    """
    lines: list[str] = []
    if settings.sanitize != "none":
        note = ""
        if sanitizer is None:
            sanitizer, note = sanitizer_for(backend, report_dir, settings)
        if note:
            lines.append(note)
        if sanitizer is not None:
            try:
                records = sanitize_trials(
                    study,
                    sanitizer,
                    settings.sanitize,
                    max_findings=settings.max_findings,
                    log=log,
                )
            except (SurrotuneError, OSError, RuntimeError) as exc:
                lines.append(f"compute-sanitizer could not run: {exc}")
            else:
                lines.extend(
                    format_sanitize(records, settings.sanitize, max_findings=settings.max_findings)
                )
    if settings.remeasure_top:
        if remeasurer is None:
            remeasurer = remeasurer_for(backend)
        if remeasurer is not None:
            try:
                report = remeasure_top(
                    study,
                    remeasurer,
                    top=settings.remeasure_top,
                    rounds=settings.remeasure_rounds,
                    # replaying takes no time: no progress line under the finished bar
                    log=None if isinstance(remeasurer, ReplayRemeasurer) else log,
                )
            except (SurrotuneError, OSError, RuntimeError) as exc:
                lines.append(f"The top configurations could not be measured again: {exc}")
            else:
                if report is not None:
                    lines.extend(report.lines())
    if counters is not None and counters.mode is not CountersMode.NONE:
        if profiler is None:
            profiler = profiler_for(backend, report_dir.with_name(report_dir.name + "-ncu"))
        if profiler is not None:
            try:
                lines.extend(
                    profile_study(study, profiler, counters, run_wall_s=run_wall_s, log=log)
                )
            except (SurrotuneError, OSError, RuntimeError) as exc:
                lines.append(f"Counters could not be read: {exc}")
    return lines


def profiler_for(backend: Backend, report_dir: Path) -> Profiles | None:
    """ncu for ``backend``'s GPU (None where nothing runs on a GPU)."""
    from surrotune.backends.cuda import CudaBackend
    from surrotune.counters.profiler import NcuProfiler

    if not isinstance(backend, CudaBackend):
        return None
    return NcuProfiler(backend, report_dir=report_dir)
