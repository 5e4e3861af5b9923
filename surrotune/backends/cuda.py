"""The cuda backend: render, compile, check against the device, then launch, verify and time.

A batch of configurations goes through four stages, and each one can end a configuration with
the Status of DESIGN.md's taxonomy, so the sampler learns from every failure:

1. render the template with the configuration and the problem sizes, and compile the whole batch
   in parallel on the CPU cores (NVRTC in a pool of processes, or nvcc: see
   :func:`surrotune.backends.compile.make_compiler`): ``compile``, or ``resource`` when ptxas runs
   out of registers or shared memory, or ``timeout``. :meth:`CudaBackend.prepare` starts this
   for the next batch while the GPU measures the current one, and :meth:`CudaBackend.evaluate`
   measures each configuration as soon as its own compile is done;
2. compute the launch geometry from the experiment's expressions (``launch`` when it is not a
   valid grid or block), compute the theoretical occupancy (:func:`kernel_occupancy`, stored
   with the trial) and check the compiled kernel's resources against the device limits before
   anything is launched (:func:`check_limits`, ``resource``, also when no block fits an SM);
3. hand the cubin to the worker process (:mod:`surrotune.backends.worker`), which owns the CUDA
   context: it launches once and compares the outputs with the reference (``correctness``), then
   times launches after ``warmup`` ones until the median is known well enough
   (:mod:`surrotune.backends.measure`), flushing the L2 when the arguments fit in it and reading
   the clocks while it times; driver errors are sorted by
   :func:`classify_cuda_error` into ``resource``, ``launch`` or ``runtime``;
4. a worker that dies (``runtime``) or stays silent past the watchdog (``timeout``) is replaced
   for the next configuration, so one bad kernel costs one trial, not the run.

The parent never imports CuPy and never creates a CUDA context, so a sticky error or a hung
kernel in the worker cannot reach it; the device properties come from the worker's hello.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from surrotune.backends.clocks import CLOCK_FIELDS
from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    KernelCompiler,
    KernelResources,
    make_compiler,
)
from surrotune.backends.measure import MeasurePolicy
from surrotune.backends.occupancy import DeviceLimits, Occupancy, OccupancyError, occupancy
from surrotune.backends.worker import (
    CudaWorkerInit,
    LaunchJob,
    LaunchReply,
    Outcome,
    WorkerHandle,
    classify_cuda_error,
    cuda_worker,
)
from surrotune.experiment import Experiment, LaunchSpec
from surrotune.result import ParamValue, Result, Status
from surrotune.template import Template

__all__ = [
    "WATCHDOG_MARGIN_S",
    "CudaBackend",
    "LaunchGeometry",
    "WorkerFactory",
    "check_limits",
    "classify_cuda_error",
    "cuda_worker_handle",
    "kernel_occupancy",
    "launch_geometry",
    "occupancy_fields",
]

#: seconds added to the watchdog for loading the module and copying outputs back
WATCHDOG_MARGIN_S = 10.0

#: builds the worker handle for an experiment and a GPU; tests pass one that drives a fake
WorkerFactory = Callable[[Experiment, int], WorkerHandle]

_AXES = ("x", "y", "z")


def cuda_worker_handle(experiment: Experiment, device_id: int) -> WorkerHandle:
    """The real worker: a process running :func:`surrotune.backends.worker.cuda_worker`."""
    return WorkerHandle(
        cuda_worker,
        CudaWorkerInit(experiment=experiment, device_id=device_id),
        name=f"surrotune-cuda{device_id}",
    )


@dataclass(frozen=True)
class LaunchGeometry:
    """Grid and block as (x, y, z), and the dynamic shared memory in bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def _pad(dims: list[int]) -> tuple[int, int, int]:
    padded = [*dims, 1, 1][:3]
    return padded[0], padded[1], padded[2]


def launch_geometry(launch: LaunchSpec, env: Mapping[str, Any]) -> LaunchGeometry:
    """Evaluate the launch expressions for one configuration.

    Raises ValueError when they do not give whole numbers, divide by zero, or give a dimension
    below 1 (CuPy would silently round a 0 up to 1 and launch a different kernel than asked).
    """
    try:
        grid = [expr.evaluate_int(env) for expr in launch.grid]
        block = [expr.evaluate_int(env) for expr in launch.block]
        shared = launch.shared_memory.evaluate_int(env)
    except (ArithmeticError, ValueError) as exc:
        raise ValueError(f"cannot compute the launch geometry: {exc}") from None
    for kind, dims in (("grid", grid), ("block", block)):
        for axis, value in zip(_AXES, dims, strict=False):
            if value < 1:
                raise ValueError(
                    f"{kind} dimension {axis} is {value}; every grid and block dimension must be "
                    "at least 1"
                )
    if shared < 0:
        raise ValueError(f"dynamic shared memory is {shared} bytes; expected 0 or more")
    return LaunchGeometry(_pad(grid), _pad(block), shared)


def check_limits(
    resources: KernelResources,
    threads: int,
    dyn_shared: int,
    grid: Sequence[int],
    block: Sequence[int],
    device_props: Mapping[str, Any],
) -> str | None:
    """Why this launch would be refused by the device, or None when it fits.

    Checked before launching so that the failure is recorded as ``resource`` with both numbers,
    instead of as whatever error the driver happens to report. The register check multiplies
    registers by threads without the allocation granularity: it catches every launch that cannot
    fit and errs only toward letting the driver refuse a borderline one.
    """
    limit = device_props["maxThreadsPerBlock"]
    if threads > limit:
        return f"{threads} threads per block exceed the device's maxThreadsPerBlock of {limit}"
    kernel_limit = resources.max_threads_per_block
    if kernel_limit is not None and threads > kernel_limit:
        return (
            f"{threads} threads per block exceed the kernel's __launch_bounds__ maximum of "
            f"{kernel_limit}"
        )
    for kind, dims, key in (("block", block, "maxThreadsDim"), ("grid", grid, "maxGridSize")):
        for axis, value, maximum in zip(_AXES, dims, device_props[key], strict=False):
            if value > maximum:
                return (
                    f"{kind} dimension {axis} is {value}, over the device's {key}[{axis}] of "
                    f"{maximum}"
                )
    registers = resources.registers * threads
    limit = device_props["regsPerBlock"]
    if registers > limit:
        return (
            f"{resources.registers} registers x {threads} threads = {registers} registers per "
            f"block exceed the device's regsPerBlock of {limit}"
        )
    shared = resources.shared_static_bytes + dyn_shared
    limit = device_props["sharedMemPerBlockOptin"]
    if shared > limit:
        return (
            f"{resources.shared_static_bytes} static + {dyn_shared} dynamic = {shared} bytes of "
            f"shared memory per block exceed the device's sharedMemPerBlockOptin of {limit}"
        )
    # What the simple checks let through but the driver would still refuse: registers allocated
    # per warp in units of 256 and counted over four sub-partitions, the reserved shared memory.
    occupancy = kernel_occupancy(resources, threads, dyn_shared, device_props)
    if occupancy is not None and not occupancy.fits:
        return f"the launch cannot run, {occupancy.explain()}"
    return None


def kernel_occupancy(
    resources: KernelResources, threads: int, dyn_shared: int, device_props: Mapping[str, Any]
) -> Occupancy | None:
    """The theoretical occupancy of a launch (:mod:`surrotune.backends.occupancy`), or None when
    the device properties lack a limit or describe a GPU the calculator does not cover."""
    try:
        limits = DeviceLimits.from_properties(device_props)
        return occupancy(
            limits,
            registers=resources.registers,
            threads=threads,
            static_shared=resources.shared_static_bytes,
            dynamic_shared=dyn_shared,
            barriers=resources.barriers,
        )
    except OccupancyError:
        return None


def occupancy_fields(result: Occupancy | None) -> dict[str, Any]:
    """The Result fields of an occupancy (none when it is unknown)."""
    if result is None:
        return {}
    return {
        "occupancy": result.fraction,
        "active_blocks_per_sm": result.active_blocks_per_sm,
        "occupancy_limiter": result.limiter,
    }


class CudaBackend:
    """Evaluates configurations on one NVIDIA GPU. Satisfies Backend, Prepares, DescribesDevice.

    The worker process starts on first use (``evaluate`` or ``device``), not here, so that
    building a backend costs nothing and needs no GPU. Use as a context manager, or call
    :meth:`close`, to stop the worker.

    Args:
        experiment: a validated experiment with [kernel], [launch] and [reference].
        device_id: the CUDA device the worker uses.
        cache_dir: where compiled cubins are cached (None: no cache).
        worker_factory: builds the worker handle; the default runs the CUDA worker.
        nvcc: the nvcc executable, when nvcc compiles.
        compile_timeout_s: how long one compile may take before it counts as ``timeout``.
        compiler: ``auto``, ``nvrtc`` or ``nvcc``; None takes the experiment's
            ``kernel.compiler`` (see :func:`surrotune.backends.compile.make_compiler`).
    """

    def __init__(
        self,
        experiment: Experiment,
        *,
        device_id: int = 0,
        cache_dir: Path | None = None,
        worker_factory: WorkerFactory = cuda_worker_handle,
        nvcc: str = "nvcc",
        compile_timeout_s: float = 120.0,
        compiler: str | None = None,
    ) -> None:
        missing = [
            section
            for section, value in (
                ("kernel", experiment.kernel),
                ("launch", experiment.launch),
                ("reference", experiment.reference),
            )
            if value is None
        ]
        if missing:
            raise ValueError(
                f"{experiment.path}: the cuda backend needs [{'], ['.join(missing)}]; "
                "add the section(s) or use the replay backend"
            )
        assert experiment.kernel is not None
        self.experiment = experiment
        self.device_id = device_id
        self.cache_dir = cache_dir
        self.nvcc = nvcc
        self.compile_timeout_s = compile_timeout_s
        self._template = Template.from_file(experiment.kernel.template)
        self.compiler: KernelCompiler = make_compiler(
            compiler or experiment.kernel.compiler,
            cache_dir=cache_dir,
            timeout_s=compile_timeout_s,
            workers=experiment.evaluation.compile_workers,
            nvcc=nvcc,
        )
        warm_up = getattr(self.compiler, "warm_up", None)
        if warm_up is not None:  # NVRTC's pool starts while the GPU worker does
            warm_up()
        self._worker = worker_factory(experiment, device_id)
        self._device: dict[str, Any] | None = None  # the same for every worker on this GPU
        #: compiles started by prepare() and not yet taken by evaluate()
        self._compiling: dict[CompileRequest, Future[CompiledKernel | CompileError]] = {}

    @property
    def compile_workers(self) -> int:
        """How many kernels the compiler builds at once (what the runner asks ahead for)."""
        return int(getattr(self.compiler, "workers", 1))

    @property
    def watchdog_s(self) -> float:
        """How long one configuration may run in the worker: every launch may take the kernel
        timeout (one checked, the warm-up and the timed ones), plus a margin."""
        evaluation = self.experiment.evaluation
        policy = MeasurePolicy.from_settings(evaluation)
        return policy.watchdog_s(evaluation.kernel_timeout_s) + WATCHDOG_MARGIN_S

    def device(self) -> dict[str, Any]:
        """The GPU's properties as the worker reported them (starts the worker if needed)."""
        if self._device is None:
            self._device = dict(self._worker.hello)
        return dict(self._device)

    def close(self) -> None:
        for future in self._compiling.values():
            future.cancel()
        self._compiling.clear()
        self.compiler.close()
        self._worker.close()

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def prepare(self, configs: Sequence[Mapping[str, ParamValue]]) -> None:
        """Start compiling ``configs`` and return at once; :meth:`evaluate` picks them up.

        The runner calls this for the next batch before evaluating the current one, so the CPU
        cores compile while the GPU measures. Preparing what is never evaluated costs only the
        compile (and fills the disk cache).
        """
        for request in self._requests(configs)[1]:
            if request not in self._compiling:
                self._compiling[request] = self.compiler.submit(request)

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
        """One Result per configuration, in order.

        Every compile is started at once (or was, by :meth:`prepare`), and each configuration is
        measured as soon as its own compile is done, in the order the compiles finish, so the GPU
        starts on the first kernel while the rest still compile.
        """
        if not configs:
            return []
        envs, requests = self._requests(configs)
        futures = [
            self._compiling.pop(request, None) or self.compiler.submit(request)
            for request in requests
        ]
        positions: dict[Future[CompiledKernel | CompileError], list[int]] = {}
        for index, future in enumerate(futures):
            positions.setdefault(future, []).append(index)
        results: list[Result | None] = [None] * len(configs)
        for future in as_completed(positions):
            outcome = future.result()  # raises only when the compiler itself cannot work
            for index in positions[future]:
                results[index] = self._measure(dict(configs[index]), envs[index], outcome)
        return [result for result in results if result is not None]

    def _requests(
        self, configs: Sequence[Mapping[str, ParamValue]]
    ) -> tuple[list[dict[str, Any]], list[CompileRequest]]:
        """The environments (sizes and parameters) and compile requests of ``configs``.

        Starts the worker first: with a fixed ``kernel.arch`` it gets ready (CuPy, inputs,
        reference) while the batch compiles; otherwise its hello tells the architecture.
        """
        kernel = self.experiment.kernel
        assert kernel is not None
        self._worker.start(wait_ready=kernel.arch is None)
        arch = kernel.arch or self.device()["arch"]
        envs = [{**self.experiment.sizes, **config} for config in configs]
        requests = [
            CompileRequest(
                source=self._template.render(env),
                kernel_name=kernel.name,
                arch=arch,
                options=kernel.options,
            )
            for env in envs
        ]
        return envs, requests

    def _measure(
        self,
        config: dict[str, ParamValue],
        env: Mapping[str, Any],
        outcome: CompiledKernel | CompileError,
    ) -> Result:
        if isinstance(outcome, CompileError):
            if outcome.timed_out:
                status = Status.TIMEOUT
            else:
                status = Status.RESOURCE if outcome.is_resource else Status.COMPILE
            return Result(
                config, status, compile_time_ms=outcome.compile_time_ms, error=outcome.message
            )
        resources = outcome.resources
        known: dict[str, Any] = {
            "compile_time_ms": outcome.compile_time_ms,
            "registers": resources.registers,
            "local_bytes": resources.local_bytes,
            "shared_bytes": resources.shared_static_bytes,
        }
        launch = self.experiment.launch
        assert launch is not None
        try:
            geometry = launch_geometry(launch, env)
        except ValueError as exc:
            return Result(config, Status.LAUNCH, error=str(exc), **known)
        known["shared_bytes"] = resources.shared_static_bytes + geometry.dynamic_shared_bytes
        known["threads_per_block"] = geometry.threads
        known.update(
            occupancy_fields(
                kernel_occupancy(
                    resources, geometry.threads, geometry.dynamic_shared_bytes, self.device()
                )
            )
        )
        violation = check_limits(
            resources,
            geometry.threads,
            geometry.dynamic_shared_bytes,
            geometry.grid,
            geometry.block,
            self.device(),
        )
        if violation is not None:
            return Result(config, Status.RESOURCE, error=violation, **known)

        evaluation = self.experiment.evaluation
        job = LaunchJob(
            cubin=outcome.cubin,
            kernel_name=outcome.kernel_name,
            grid=geometry.grid,
            block=geometry.block,
            dynamic_shared_bytes=geometry.dynamic_shared_bytes,
            warmup=evaluation.warmup,
            repeats=evaluation.repeats,
            max_repeats=evaluation.max_repeats,
            target_precision=evaluation.target_precision,
            max_measure_s=evaluation.max_measure_s,
            l2_flush=evaluation.l2_flush,
            static_shared_bytes=resources.shared_static_bytes,
        )
        started = time.perf_counter()
        reply = self._worker.request(job, self.watchdog_s)
        wall_ms = (time.perf_counter() - started) * 1e3
        if reply.outcome is Outcome.REPLY:
            return self._result(config, env, reply.value, known)
        if reply.outcome is Outcome.TIMEOUT:
            message = (
                f"the kernel did not finish: {reply.message} (watchdog: kernel_timeout "
                f"{evaluation.kernel_timeout_s:g} s for each launch before the timing cap, the "
                f"cap of {evaluation.max_measure_s:g} s when timing adaptively, "
                f"+ {WATCHDOG_MARGIN_S:g} s)"
            )
            return Result(
                config, Status.TIMEOUT, error=message, benchmark_time_ms=wall_ms, **known
            )
        if reply.outcome is Outcome.DIED:
            return Result(
                config, Status.RUNTIME, error=reply.message, benchmark_time_ms=wall_ms, **known
            )
        # Outcome.ERROR: the worker's job code raised; the state of its context is unknown.
        self._worker.restart(wait_ready=False)
        return Result(
            config,
            Status.RUNTIME,
            error=f"the worker raised:\n{reply.message}",
            benchmark_time_ms=wall_ms,
            **known,
        )

    def _result(
        self,
        config: dict[str, ParamValue],
        env: Mapping[str, Any],
        reply: LaunchReply,
        known: dict[str, Any],
    ) -> Result:
        fields = {
            "times_ms": reply.times_ms,
            "benchmark_time_ms": reply.benchmark_time_ms,
            "verification_error": reply.verification_error,
            "timing_precision": reply.timing_precision,
            "timing_stop": reply.timing_stop,
            "l2_flush": reply.l2_flush if reply.times_ms else None,
            **{key: value for key, value in reply.clocks.items() if key in CLOCK_FIELDS},
            **known,
        }
        if reply.status is not Status.OK:
            return Result(config, reply.status, error=reply.error, **fields)
        median = statistics.median(reply.times_ms) if reply.times_ms else math.nan
        try:
            objective = self.experiment.objective.value(median, env)
        except ZeroDivisionError:
            objective = math.nan
        if not math.isfinite(objective):
            message = f"a median time of {median} ms gives no finite objective"
            return Result(config, Status.RUNTIME, error=message, **fields)
        return Result(config, Status.OK, objective=objective, **fields)
