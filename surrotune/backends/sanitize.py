"""compute-sanitizer on the winning configurations, before they are reported.

A kernel can pass verification and still be wrong: a write one element past the end of an array
lands in the allocation's rounding and corrupts nothing this time; a shared-memory race gives the
right answer on this GPU at this clock. NVIDIA's compute-sanitizer finds both, at 10-100x the run
time, far too slow for every trial but affordable for the few that are about to be reported.

How one configuration is checked (:class:`CudaSanitizer`):

1. its cubin comes from the backend's own compiler and compile cache (the same request the
   cuda backend made), and its launch geometry from the experiment, exactly as measured;
2. ``compute-sanitizer --tool memcheck`` and then ``--tool racecheck`` each run
   ``python -m surrotune.backends.sanitize JOB``, a small process that builds the inputs as the
   worker does (:func:`surrotune.backends.worker.create_inputs`, without CuPy's memory pool, so
   that every array is an allocation of its own and memcheck sees its exact bounds), launches
   the kernel once and synchronises;
3. the tool's output is saved as a report file and parsed (:func:`parse_sanitizer_output`):
   memcheck errors are memory errors (``runtime``), racecheck errors are races
   (``correctness``). A sanitizer that cannot finish (timeout, no summary line, the process
   failed for another reason) is *inconclusive*: nothing is demoted on a guess.

The policy (:func:`sanitize_trials`): ``best`` checks the best configuration and, while one is
found wrong, the next best (at most ``max_findings`` demotions, so that a template broken
everywhere does not sanitize the whole study); ``all`` checks every ``ok`` configuration; ``none``
checks nothing. A finding demotes the trial through a study attribute
(:mod:`surrotune.verdicts`), because Optuna freezes finished trials.
"""

from __future__ import annotations

import contextlib
import enum
import glob
import importlib.util
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import optuna

from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    run_process_group,
)
from surrotune.experiment import Experiment
from surrotune.result import ParamValue, Status
from surrotune.template import Template
from surrotune.verdicts import (
    SANITIZER_PREFIX,
    ranked_ok_trials,
    set_trial_verdict,
    trial_verdicts,
)

if TYPE_CHECKING:
    from surrotune.backends.cuda import CudaBackend

__all__ = [
    "MODES",
    "TOOLS",
    "TOOL_STATUS",
    "CudaSanitizer",
    "SanitizeJob",
    "SanitizeOutcome",
    "SanitizeRecord",
    "SanitizeResult",
    "SanitizerReport",
    "Sanitizes",
    "find_compute_sanitizer",
    "format_sanitize",
    "launch_arguments",
    "launch_kernel",
    "launch_once",
    "main",
    "parse_sanitizer_output",
    "rebuild_launch",
    "rebuild_launches",
    "run_sanitizer",
    "sanitize_trials",
]

#: the values of ``--sanitize``
MODES = ("best", "all", "none")
#: the tools run on each configuration, in order (the first finding ends the check)
TOOLS = ("memcheck", "racecheck")
#: the Status a finding of each tool demotes a trial to
TOOL_STATUS: dict[str, Status] = {"memcheck": Status.RUNTIME, "racecheck": Status.CORRECTNESS}

#: compute-sanitizer's exit code when it found an error (any value the target never uses)
_ERROR_EXITCODE = 86
#: above this much dynamic shared memory a kernel must opt in (cudaFuncAttribute)
_DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024
#: how many lines of a finding are kept in the study (the report file has everything)
_SUMMARY_LINES = 8


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class SanitizerReport:
    """What one compute-sanitizer run said.

    ``errors`` is the count on the tool's summary line (``ERROR SUMMARY: N errors``; where
    racecheck prints ``RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)``, E),
    None when no summary line was printed (the tool did not finish). ``findings`` holds each
    reported problem as its lines, the heading first, without the ``=========`` prefix.
    """

    tool: str
    errors: int | None
    warnings: int = 0
    findings: tuple[tuple[str, ...], ...] = ()

    @property
    def complete(self) -> bool:
        return self.errors is not None

    @property
    def kernel_findings(self) -> tuple[tuple[str, ...], ...]:
        """The findings about the kernel: every one but the failed CUDA API calls ("Program hit
        ... on CUDA API call to ..."), which follow from a kernel error or, alone, from the
        host code (a library probing for a feature), never from the kernel itself."""
        return tuple(f for f in self.findings if not f[0].startswith(_API_ERROR))

    @property
    def found(self) -> bool:
        """An error was counted and at least one of them is the kernel's."""
        return bool(self.errors) and bool(self.kernel_findings)

    def summary(self) -> str:
        """The count and the first finding, a few lines: what the study keeps."""
        if self.errors is None:
            return f"{self.tool}: no summary line (the tool did not finish)"
        count = f"{self.errors} error{'s' if self.errors != 1 else ''}"
        if self.warnings:
            count += f", {self.warnings} warning{'s' if self.warnings != 1 else ''}"
        lines = [f"{self.tool}: {count}"]
        shown = self.kernel_findings or self.findings
        if shown:
            lines.extend(shown[0][:_SUMMARY_LINES])
        return "\n".join(lines)


_LINE = re.compile(r"^=========(?P<body>.*)$")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?", re.IGNORECASE)
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*"
    r"\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)",
    re.IGNORECASE,
)
_API_ERROR = "Program hit "
_NOT_FINDINGS = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application)"
)


def parse_sanitizer_output(text: str, tool: str) -> SanitizerReport:
    """Parse compute-sanitizer's text output (the target's own output may be mixed in).

    Every line of the tool starts with ``=========``; a finding is a line right after the
    prefix and one space (``========= Invalid __global__ write of size 4 bytes``), its details
    are the indented lines that follow, and a bare ``=========`` ends it.
    """
    errors: int | None = None
    race: tuple[int, int] | None = None
    findings: list[list[str]] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        match = _LINE.match(raw.rstrip())
        if match is None:
            continue  # the target's own output
        body = match["body"]
        if not body.strip():
            current = None
            continue
        summary = _ERROR_SUMMARY.search(body)
        if summary is not None and errors is None:
            errors = int(summary[1])
            current = None
            continue
        races = _RACE_SUMMARY.search(body)
        if races is not None:
            race = (int(races[2]), int(races[3]))
            current = None
            continue
        heading = body.removeprefix(" ")
        if heading and not heading[0].isspace():
            if _NOT_FINDINGS.match(heading):
                current = None
                continue
            current = [heading]
            findings.append(current)
        elif current is not None:
            current.append(heading.strip())
    warnings = 0
    if race is not None:  # racecheck's own count tells errors from warnings; trust it
        errors, warnings = race
    return SanitizerReport(tool, errors, warnings, tuple(tuple(f) for f in findings))


# --------------------------------------------------------------------------- finding the tool


def find_compute_sanitizer() -> str | None:
    """The compute-sanitizer executable, or None.

    Looked for on PATH, in the CUDA toolkit (``$CUDA_HOME``, ``$CUDA_PATH``, /usr/local/cuda)
    and in the ``nvidia-cuda-sanitizer-api`` wheel, which ships it inside the Python
    environment.
    """
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in roots:
        if not root:
            continue
        for candidate in (
            Path(root) / "bin" / "compute-sanitizer",
            Path(root) / "compute-sanitizer" / "compute-sanitizer",
        ):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("nvidia")
        for location in (spec.submodule_search_locations or []) if spec else []:
            for pattern in ("*/bin/compute-sanitizer", "*/compute-sanitizer/compute-sanitizer"):
                for candidate in sorted(glob.glob(os.path.join(location, pattern))):
                    if os.access(candidate, os.X_OK):
                        return candidate
    return None


# --------------------------------------------------------------------------- one configuration


class SanitizeOutcome(enum.StrEnum):
    """The verdict on one configuration."""

    CLEAN = "clean"  # every tool finished and found nothing
    FINDING = "finding"  # a tool found an error: the trial is demoted
    INCONCLUSIVE = "inconclusive"  # a tool could not finish; nothing is concluded


@dataclass(frozen=True)
class SanitizeResult:
    """What checking one configuration gave; ``status`` is the demotion, on a finding only."""

    outcome: SanitizeOutcome
    status: Status | None = None
    tool: str | None = None
    summary: str = ""
    reports: tuple[str, ...] = ()

    def to_attrs(self) -> dict[str, Any]:
        """As stored in the study attribute ``sanitizer.<trial>`` (JSON)."""
        attrs: dict[str, Any] = {"outcome": self.outcome.value, "reports": list(self.reports)}
        if self.status is not None:
            attrs["status"] = self.status.value
        if self.tool is not None:
            attrs["tool"] = self.tool
        if self.summary:
            attrs["summary"] = self.summary
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> SanitizeResult:
        status = attrs.get("status")
        return cls(
            outcome=SanitizeOutcome(attrs.get("outcome", SanitizeOutcome.INCONCLUSIVE.value)),
            status=Status(status) if status else None,
            tool=attrs.get("tool"),
            summary=attrs.get("summary", ""),
            reports=tuple(attrs.get("reports") or ()),
        )


@runtime_checkable
class Sanitizes(Protocol):
    """Checks one configuration; ``label`` names its report files (``gemm-trial83``)."""

    def sanitize(self, config: Mapping[str, ParamValue], label: str) -> SanitizeResult: ...


@dataclass(frozen=True)
class SanitizeJob:
    """What the process under compute-sanitizer needs: pickled to a file it reads."""

    experiment: Experiment
    cubin: bytes
    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    device_id: int = 0


def run_sanitizer(
    executable: str,
    tool: str,
    job_path: Path,
    *,
    timeout_s: float,
    print_limit: int = 20,
) -> tuple[int | None, str]:
    """Run ``compute-sanitizer --tool TOOL python -m surrotune.backends.sanitize JOB``.

    Returns the exit code (None on timeout) and the combined output. The run has its own
    process group, killed as a whole on timeout: the sanitizer's target would otherwise live on.
    """
    command = [
        executable,
        "--tool",
        tool,
        "--error-exitcode",
        str(_ERROR_EXITCODE),
        "--print-limit",
        str(print_limit),
        sys.executable,
        "-m",
        "surrotune.backends.sanitize",
        str(job_path),
    ]
    return run_process_group(command, timeout_s)


def rebuild_launch(backend: CudaBackend, config: Mapping[str, ParamValue]) -> SanitizeJob:
    """The cubin and launch of ``config``, as ``backend`` compiled and launched it: for a tool
    (compute-sanitizer, ncu) that must run the very kernel that was timed.

    Raises CompileError (or ValueError for the geometry) when it cannot be built; a
    configuration that was measured ``ok`` never does, and the cubin comes from the backend's
    compile cache where it has one.
    """
    # the backend's own compiler (NVRTC or nvcc) and cache: the very cubin that was timed
    compiled = backend.compiler.submit(_launch_request(backend, config)).result()
    return _launch_job(backend, config, compiled)


def rebuild_launches(
    backend: CudaBackend, configs: Sequence[Mapping[str, ParamValue]]
) -> list[SanitizeJob | CompileError | ValueError]:
    """:func:`rebuild_launch` of each of ``configs``, compiled in parallel (a fresh machine's
    cache is empty: one compile after another would cost a batch seconds per configuration);
    the error in place of a job that cannot be built."""
    futures = [backend.compiler.submit(_launch_request(backend, c)) for c in configs]
    jobs: list[SanitizeJob | CompileError | ValueError] = []
    for config, future in zip(configs, futures, strict=True):
        try:
            jobs.append(_launch_job(backend, config, future.result()))
        except (CompileError, ValueError) as error:
            jobs.append(error)
    return jobs


def _launch_request(backend: CudaBackend, config: Mapping[str, ParamValue]) -> CompileRequest:
    experiment = backend.experiment
    kernel = experiment.kernel
    assert kernel is not None  # CudaBackend checked it
    return CompileRequest(
        source=Template.from_file(kernel.template).render({**experiment.sizes, **config}),
        kernel_name=kernel.name,
        arch=kernel.arch or backend.device()["arch"],
        options=kernel.options,
    )


def _launch_job(
    backend: CudaBackend,
    config: Mapping[str, ParamValue],
    compiled: CompiledKernel | CompileError,
) -> SanitizeJob:
    from surrotune.backends.cuda import launch_geometry

    if isinstance(compiled, CompileError):
        raise compiled
    experiment = backend.experiment
    assert experiment.launch is not None  # CudaBackend checked it
    geometry = launch_geometry(experiment.launch, {**experiment.sizes, **config})
    return SanitizeJob(
        experiment=experiment,
        cubin=compiled.cubin,
        kernel_name=compiled.kernel_name,
        grid=geometry.grid,
        block=geometry.block,
        dynamic_shared_bytes=geometry.dynamic_shared_bytes,
        device_id=backend.device_id,
    )


class CudaSanitizer:
    """Checks configurations of a :class:`~surrotune.backends.cuda.CudaBackend`'s experiment.

    Args:
        backend: the backend that measured them: its experiment, compile cache, nvcc and GPU.
        report_dir: where each tool's report is written, as ``<label>-<tool>.txt``.
        executable: compute-sanitizer (see :func:`find_compute_sanitizer`).
        tools: the tools to run, in order.
        timeout_s: how long one tool may run on one configuration. Racecheck instruments every
            shared-memory access and can take minutes on a large problem; a timeout is
            inconclusive, not a finding.
        print_limit: findings printed per run (``--print-limit``); the count is exact anyway.
    """

    def __init__(
        self,
        backend: CudaBackend,
        report_dir: Path,
        *,
        executable: str,
        tools: Sequence[str] = TOOLS,
        timeout_s: float = 600.0,
        print_limit: int = 20,
    ) -> None:
        unknown = [tool for tool in tools if tool not in TOOL_STATUS]
        if unknown:
            raise ValueError(f"unknown sanitizer tool(s) {unknown}; expected some of {TOOLS}")
        self.backend = backend
        self.report_dir = Path(report_dir)
        self.executable = executable
        self.tools = tuple(tools)
        self.timeout_s = timeout_s
        self.print_limit = print_limit

    def job(self, config: Mapping[str, ParamValue]) -> SanitizeJob:
        """The cubin and launch of ``config``, as the backend compiled and launched it."""
        return rebuild_launch(self.backend, config)

    def sanitize(self, config: Mapping[str, ParamValue], label: str) -> SanitizeResult:
        """Run each tool on ``config``; the first finding (or inconclusive run) ends the check."""
        try:
            job = self.job(config)
        except (CompileError, ValueError) as exc:
            return SanitizeResult(
                SanitizeOutcome.INCONCLUSIVE, summary=f"cannot rebuild the launch: {exc}"
            )
        self.report_dir.mkdir(parents=True, exist_ok=True)
        reports: list[str] = []
        with tempfile.TemporaryDirectory(prefix="surrotune-sanitize-") as scratch:
            job_path = Path(scratch) / "job.pickle"
            job_path.write_bytes(pickle.dumps(job))
            for tool in self.tools:
                started = time.monotonic()
                code, output = run_sanitizer(
                    self.executable,
                    tool,
                    job_path,
                    timeout_s=self.timeout_s,
                    print_limit=self.print_limit,
                )
                elapsed = time.monotonic() - started
                report_path = self.report_dir / f"{label}-{tool}.txt"
                report_path.write_text(
                    f"# compute-sanitizer --tool {tool} on {_config_text(config)}\n"
                    f"# exit code {code}, {elapsed:.1f} s\n{output}"
                )
                reports.append(str(report_path))
                verdict = _judge(tool, code, output, self.timeout_s)
                if verdict.outcome is not SanitizeOutcome.CLEAN:
                    return SanitizeResult(
                        verdict.outcome,
                        status=verdict.status,
                        tool=tool,
                        summary=verdict.summary,
                        reports=tuple(reports),
                    )
        return SanitizeResult(SanitizeOutcome.CLEAN, reports=tuple(reports))


def _judge(tool: str, code: int | None, output: str, timeout_s: float) -> SanitizeResult:
    """One tool's run as a verdict. Errors with one in the kernel are a finding, whatever the
    exit code; errors that are only failed API calls, a clean summary with a failed target, a
    missing summary or a timeout are inconclusive."""
    if code is None:
        return SanitizeResult(
            SanitizeOutcome.INCONCLUSIVE, summary=f"{tool}: did not finish within {timeout_s:g} s"
        )
    report = parse_sanitizer_output(output, tool)
    if report.found:
        return SanitizeResult(
            SanitizeOutcome.FINDING, status=TOOL_STATUS[tool], summary=report.summary()
        )
    if report.errors:
        return SanitizeResult(
            SanitizeOutcome.INCONCLUSIVE,
            summary=f"{tool}: only failed CUDA API calls, nothing in the kernel\n"
            + report.summary(),
        )
    if not report.complete or code != 0:
        tail = "\n".join(output.strip().splitlines()[-_SUMMARY_LINES:])
        return SanitizeResult(
            SanitizeOutcome.INCONCLUSIVE,
            summary=f"{tool}: exit code {code} and no error counted; the output ends:\n{tail}",
        )
    return SanitizeResult(SanitizeOutcome.CLEAN)


def _config_text(config: Mapping[str, ParamValue]) -> str:
    return " ".join(f"{name}={value}" for name, value in config.items())


# --------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class SanitizeRecord:
    """One trial the policy looked at; ``stored`` when its verdict came from an earlier run."""

    number: int
    config: dict[str, ParamValue]
    result: SanitizeResult
    stored: bool = False


def sanitize_trials(
    study: optuna.Study,
    sanitizer: Sanitizes,
    mode: str = "best",
    *,
    max_findings: int = 10,
    log: Callable[[str], None] | None = None,
) -> list[SanitizeRecord]:
    """Apply ``--sanitize MODE`` to the study; returns what was looked at, best first.

    ``best`` walks the ranking until a configuration is clean (or inconclusive: the winner then
    stands, unconfirmed); ``all`` checks every ``ok`` configuration. Verdicts stored by an
    earlier run are reused, not recomputed, except inconclusive ones, which are not stored.
    A finding is stored at once, so an interrupted check loses nothing already found.
    """
    if mode not in MODES:
        raise ValueError(f"--sanitize must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "none":
        return []
    stored = trial_verdicts(study, SANITIZER_PREFIX)
    records: list[SanitizeRecord] = []
    findings = 0
    for trial in ranked_ok_trials(study):
        config = dict(trial.params)
        if trial.number in stored:
            result = SanitizeResult.from_attrs(stored[trial.number])
            records.append(SanitizeRecord(trial.number, config, result, stored=True))
        else:
            if log is not None:
                log(f"surrotune: sanitizing trial {trial.number}: {_config_text(config)}")
            label = re.sub(r"[^\w.-]", "_", f"{study.study_name}-trial{trial.number}")
            result = sanitizer.sanitize(config, label)
            if result.outcome is not SanitizeOutcome.INCONCLUSIVE:
                set_trial_verdict(study, SANITIZER_PREFIX, trial.number, result.to_attrs())
            records.append(SanitizeRecord(trial.number, config, result))
        if result.outcome is SanitizeOutcome.FINDING:
            findings += 1
            if findings >= max_findings:
                break
            continue
        if mode == "best":
            break
    return records


def format_sanitize(
    records: Sequence[SanitizeRecord], mode: str, *, max_findings: int = 10
) -> list[str]:
    """The lines the end-of-run summary prints about the sanitizer."""
    if not records:
        return []
    findings = [r for r in records if r.result.outcome is SanitizeOutcome.FINDING]
    clean = [r for r in records if r.result.outcome is SanitizeOutcome.CLEAN]
    unsure = [r for r in records if r.result.outcome is SanitizeOutcome.INCONCLUSIVE]
    what = "the best configuration" if mode == "best" else "every ok configuration"
    lines = [
        f"compute-sanitizer on {what}: {len(clean)} clean, {len(findings)} demoted"
        + (f", {len(unsure)} inconclusive" if unsure else "")
    ]
    for record in records:
        result = record.result
        earlier = " (verdict of an earlier run)" if record.stored else ""
        if result.outcome is SanitizeOutcome.FINDING:
            first = result.summary.splitlines()
            head = "; ".join(first[:2]) if first else (result.tool or "")
            status = result.status.value if result.status else "runtime"
            lines.append(f"  trial {record.number}: demoted to {status}{earlier}: {head}")
            if result.reports:
                lines.append(f"    report: {result.reports[-1]}")
        elif result.outcome is SanitizeOutcome.INCONCLUSIVE:
            first = result.summary.splitlines()[0] if result.summary else "no verdict"
            lines.append(f"  trial {record.number}: inconclusive, left as it is: {first}")
        elif mode == "best" or record is records[0]:
            lines.append(f"  trial {record.number}: clean{earlier}")
    if len(findings) >= max_findings:
        lines.append(
            f"  stopped after {max_findings} findings: the template itself is likely at fault"
        )
    return lines


# --------------------------------------------------------------------------- the target process


def launch_arguments(experiment: Experiment, device_id: int, *, pool: bool = False) -> tuple:
    """The kernel's arguments on the GPU, built as the worker builds them (same inputs, outputs
    reset as before a check).

    With ``pool`` False, CuPy's memory pool is switched off first: pooled arrays share one driver
    allocation, and a write past the end of one would land inside another, where memcheck cannot
    see it.
    """
    import cupy

    from surrotune.backends.worker import create_inputs, reset_output

    if not pool:
        cupy.cuda.set_allocator(None)
    cupy.cuda.Device(device_id).use()
    host = create_inputs(experiment.arguments, experiment.sizes, experiment.evaluation.seed)
    device = {
        name: cupy.asarray(value) if isinstance(value, np.ndarray) else value
        for name, value in host.items()
    }
    for arg in experiment.arguments:
        if arg.output or arg.fill == "output":
            reset_output(device[arg.name], arg.fill)
    cupy.cuda.Device().synchronize()
    return tuple(device[arg.name] for arg in experiment.arguments)


def launch_kernel(job: SanitizeJob, args: tuple) -> int:
    """Load ``job``'s cubin, launch it once on ``args`` and synchronise (exit code, 1 on a CUDA
    error, which is printed)."""
    import cupy

    try:
        module = cupy.cuda.function.Module()
        module.load(job.cubin)
        function = module.get_function(job.kernel_name)
        if job.dynamic_shared_bytes > _DEFAULT_DYNAMIC_SHARED_LIMIT:
            cupy.cuda.driver.funcSetAttribute(
                function.ptr,
                cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                job.dynamic_shared_bytes,
            )
        function(job.grid, job.block, args, shared_mem=job.dynamic_shared_bytes)
        cupy.cuda.Device().synchronize()
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
        print(f"surrotune sanitize target: {exc}", file=sys.stderr)
        return 1
    return 0


def launch_once(job: SanitizeJob) -> int:
    """Build the inputs as the worker does, launch the kernel once, synchronise (exit code)."""
    code = launch_kernel(job, launch_arguments(job.experiment, job.device_id))
    if code == 0:
        print("surrotune sanitize target: launched and synchronised")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m surrotune.backends.sanitize JOB``: the process compute-sanitizer watches."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m surrotune.backends.sanitize JOB.pickle", file=sys.stderr)
        return 2
    # Run as ``-m``, this module is ``__main__``; the pickled job names the importable module,
    # so check and launch with that one's definitions.
    from surrotune.backends import sanitize

    job = pickle.loads(Path(args[0]).read_bytes())
    if not isinstance(job, sanitize.SanitizeJob):
        print(f"{args[0]} holds no SanitizeJob", file=sys.stderr)
        return 2
    return sanitize.launch_once(job)


if __name__ == "__main__":  # pragma: no cover - runs under compute-sanitizer
    sys.exit(main())
