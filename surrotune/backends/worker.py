"""The worker process: kernels run here, so that one that crashes or hangs takes nothing with it.

Two halves live in this module:

* :class:`WorkerHandle`, the parent's side. It starts a child process with the ``spawn`` context
  (never ``fork``: a forked CUDA context is unusable, and the parent must not hold one anyway),
  talks to it over a :func:`multiprocessing.Pipe` and turns every way a child can end into a
  :class:`WorkerReply`: an answer, a Python exception, a death (segfault, ``os._exit``, a CUDA
  error that kills the context) or silence past a deadline, after which the child is killed.
  The handle knows nothing about CUDA: it drives any :data:`WorkerTarget`, which is how CI tests
  the containment without a GPU, and how a runner can later keep one worker per GPU and overlap
  compilation with measurement (:meth:`WorkerHandle.submit` / :meth:`WorkerHandle.receive`).
* :func:`cuda_worker`, the target that owns the CUDA context: it builds the kernel arguments from
  the experiment, computes the reference outputs once, then for every :class:`LaunchJob` loads
  the cubin, launches, verifies against the reference and times with CUDA events. CuPy is
  imported inside it only, so this module imports on machines without CuPy or a GPU.

The pure pieces the worker is built from (argument creation, poisoning, the verification error,
the classification of CUDA error names) are module-level functions, tested on the CPU; so are
the timing statistics (:mod:`surrotune.backends.measure`: when the median is known well enough,
when to flush the L2) and the clock readers (:mod:`surrotune.backends.clocks`).
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import math
import multiprocessing
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from surrotune.backends.clocks import ClockReader, NoClocks, open_clock_reader
from surrotune.backends.measure import MeasurePolicy, choose_l2_flush, next_round
from surrotune.errors import SurrotuneError
from surrotune.experiment import ArgumentSpec, Experiment, ExperimentError, ReferenceSpec
from surrotune.result import Status

__all__ = [
    "DEVICE_PROPERTIES",
    "CudaWorkerInit",
    "LaunchJob",
    "LaunchReply",
    "Outcome",
    "Retire",
    "WorkerHandle",
    "WorkerReply",
    "WorkerStartError",
    "WorkerTarget",
    "check_inputs",
    "classify_cuda_error",
    "compute_expected",
    "create_inputs",
    "cuda_error_name",
    "cuda_worker",
    "device_properties",
    "fill_array",
    "load_reference",
    "poison",
    "poison_value",
    "relative_l2_error",
    "reset_output",
]

#: A worker target runs in the child: ``target(init) -> (hello, handle)``. ``hello`` is sent to
#: the parent once the child is ready (the CUDA worker sends the device properties), then
#: ``handle(job)`` answers each job. It must be a module-level function, because the ``spawn``
#: context pickles it by reference.
WorkerTarget = Callable[[Any], tuple[Any, Callable[[Any], Any]]]

#: how long a child may take to exit after it was asked to, or after it was killed
_EXIT_GRACE_S = 5.0
#: how long the parent waits to reap a killed child that is stuck in the driver; past this the
#: handle moves on and the kernel reaps the zombie when it finally dies
_KILL_WAIT_S = 30.0


# --------------------------------------------------------------------------- the generic handle


class Outcome(enum.StrEnum):
    """How a request ended."""

    REPLY = "reply"  # the target answered; ``value`` holds the answer
    ERROR = "error"  # the target raised; ``message`` holds the traceback, the child lives on
    DIED = "died"  # the child ended without answering; ``exit_code`` says how
    TIMEOUT = "timeout"  # no answer in time; the child was killed


@dataclass(frozen=True)
class WorkerReply:
    """What came back for one job. ``retired`` marks an answer after which the child exited."""

    outcome: Outcome
    value: Any = None
    message: str = ""
    exit_code: int | None = None
    retired: bool = False


@dataclass(frozen=True)
class Retire:
    """Returned by a target's ``handle`` instead of a plain value: "here is my answer, and this
    process must not serve another job" (a sticky CUDA error has poisoned its context). The child
    sends ``value`` and exits; the handle starts a fresh child for the next job."""

    value: Any


class WorkerStartError(SurrotuneError, RuntimeError):
    """The child could not get ready: its setup raised, it died, or it took too long.

    Unlike a failing job this is not a property of one configuration (no GPU, CuPy missing, a
    broken reference function), so it is raised rather than recorded as a Result.
    """


def _describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "worker process died (exit code unknown)"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"worker process died (exit code {exit_code}, killed by {name})"
    return f"worker process died (exit code {exit_code})"


def _serve(conn: Connection, target: WorkerTarget, init: Any) -> None:
    """The child's main loop: set up, say hello, answer jobs until told to stop (``None``)."""
    # Ctrl-C in the terminal reaches the whole process group; the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        hello, handle = target(init)
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", hello))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if job is None:
            return
        try:
            value = handle(job)
        except Exception:
            conn.send(("error", traceback.format_exc()))
            continue
        if isinstance(value, Retire):
            conn.send(("retire", value.value))
            conn.close()
            # Skip interpreter teardown: with a dead CUDA context, library finalizers (memory
            # pools, modules) can fail or hang, and nothing in this process is worth saving.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        conn.send(("reply", value))


class WorkerHandle:
    """The parent's side of one worker process running ``target(init)``.

    The process starts lazily (first :meth:`request`) or with :meth:`start`; after a death, a
    timeout or a retirement the next request starts a fresh one, so callers never have to check.
    Not thread-safe: one handle, one caller.

    Args:
        target: a module-level :data:`WorkerTarget`.
        init: its argument, pickled to the child (keep it small and picklable).
        start_timeout_s: how long the child may take to get ready (imports, inputs, reference).
        name: the process name, for ``ps`` and error messages.
    """

    def __init__(
        self,
        target: WorkerTarget,
        init: Any = None,
        *,
        start_timeout_s: float = 600.0,
        name: str = "surrotune-worker",
    ) -> None:
        self.target = target
        self.init = init
        self.start_timeout_s = start_timeout_s
        self.name = name
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None  # multiprocessing.context.SpawnProcess
        self._conn: Connection | None = None
        self._hello: Any = None
        self._ready = False
        self._pending = False
        self.starts = 0  #: how many processes this handle has started (restarts included)

    # -- lifecycle

    @property
    def alive(self) -> bool:
        """Whether a child is running and can take a job."""
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self, *, wait_ready: bool = True) -> None:
        """Start the child if none is running; with ``wait_ready``, wait for its hello.

        Starting without waiting lets the caller do other work (compile a batch) while the child
        imports CuPy and builds its inputs; :attr:`hello` and :meth:`submit` wait as needed.
        Raises :class:`WorkerStartError` when the child cannot get ready.
        """
        if self._process is None or (self._ready and not self._process.is_alive()):
            self._spawn()
        if wait_ready:
            self._wait_ready()

    def _spawn(self) -> None:
        self._discard()
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_serve, args=(child_conn, self.target, self.init), name=self.name, daemon=True
        )
        process.start()
        # Only the child may hold its end: otherwise its death would never show up as EOF.
        child_conn.close()
        self._process, self._conn = process, parent_conn
        self._ready = self._pending = False
        self.starts += 1

    @property
    def hello(self) -> Any:
        """What the target sent when it got ready (starts the child if needed)."""
        self.start(wait_ready=True)
        return self._hello

    def restart(self, *, wait_ready: bool = True) -> None:
        """Kill the current child, if any, and start a fresh one."""
        self._kill()
        self.start(wait_ready=wait_ready)

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not. Safe to call twice."""
        if self._process is None:
            return
        if self._process.is_alive() and self._conn is not None and not self._pending:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            self._process.join(_EXIT_GRACE_S)
        self._kill()

    def __enter__(self) -> WorkerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- jobs

    def request(self, job: Any, timeout_s: float) -> WorkerReply:
        """Send ``job`` and wait at most ``timeout_s`` seconds for its answer."""
        self.submit(job)
        return self.receive(timeout_s)

    def submit(self, job: Any) -> None:
        """Send ``job`` without waiting for the answer (starting a fresh child if needed)."""
        if self._pending:
            raise RuntimeError("a job is already pending; call receive() first")
        self.start(wait_ready=True)
        assert self._conn is not None
        # if the child died right after its hello, the send fails and receive() reports it
        with contextlib.suppress(OSError):
            self._conn.send(job)
        self._pending = True

    def receive(self, timeout_s: float) -> WorkerReply:
        """The answer to the submitted job; kills the child if none comes within ``timeout_s``."""
        if not self._pending:
            raise RuntimeError("no job is pending; call submit() first")
        self._pending = False
        assert self._conn is not None and self._process is not None
        message = self._recv(timeout_s)
        if message is None:
            self._kill()
            return WorkerReply(
                Outcome.TIMEOUT,
                message=f"no reply within {timeout_s:g} s; the worker process was killed",
            )
        if message == "died":
            exit_code = self._reap()
            return WorkerReply(
                Outcome.DIED, message=_describe_exit(exit_code), exit_code=exit_code
            )
        tag, value = message
        if tag == "reply":
            return WorkerReply(Outcome.REPLY, value=value)
        if tag == "retire":
            exit_code = self._reap()
            return WorkerReply(Outcome.REPLY, value=value, exit_code=exit_code, retired=True)
        return WorkerReply(Outcome.ERROR, message=str(value))

    # -- internals

    def _recv(self, timeout_s: float) -> Any:
        """A message, ``"died"`` when the child ended without one, ``None`` on timeout."""
        assert self._conn is not None and self._process is not None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            ready = wait([self._conn, self._process.sentinel], max(0.0, remaining))
            # A child may send its answer and exit at once: read the pipe before the sentinel.
            if self._conn.poll():
                try:
                    return self._conn.recv()
                except (EOFError, OSError):
                    return "died"
            if self._process.sentinel in ready:
                return "died"
            if remaining <= 0:
                return None

    def _wait_ready(self) -> None:
        if self._ready:
            return
        message = self._recv(self.start_timeout_s)
        if message is None:
            self._kill()
            raise WorkerStartError(
                f"{self.name} did not get ready within {self.start_timeout_s:g} s; it was killed"
            )
        if message == "died":
            exit_code = self._reap()
            raise WorkerStartError(f"{self.name}: {_describe_exit(exit_code)} while starting")
        tag, value = message
        if tag != "ready":
            self._reap()
            raise WorkerStartError(f"{self.name} failed to start:\n{value}")
        self._hello = value
        self._ready = True

    def _reap(self) -> int | None:
        """Wait for a child that is exiting on its own; kill it if it lingers."""
        assert self._process is not None
        self._process.join(_EXIT_GRACE_S)
        if self._process.is_alive():
            self._kill()
        exit_code = self._process.exitcode
        self._discard()
        return exit_code

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(_KILL_WAIT_S)
        self._discard()

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None and not self._process.is_alive():
            self._process.close()
        self._process, self._conn = None, None
        self._ready = self._pending = False


# --------------------------------------------------------------------------- arguments and data

#: the integer range of "random" and "randint" fills: small, so that sums cannot overflow
_SIGNED_RANGE = (-8, 8)
_UNSIGNED_RANGE = (0, 16)


def poison_value(dtype: np.dtype[Any]) -> Any:
    """The value an output holds before a launch: NaN for floats, the most negative integer
    (largest unsigned) for integers, so that an element the kernel never writes fails the check.
    ``None`` for dtypes without one (bool): :func:`poison` then fills the bytes with ``0xFF``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return dtype.type(np.nan)
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return None


def poison(array: Any) -> None:
    """Overwrite ``array`` (NumPy or CuPy, in place) with :func:`poison_value`."""
    value = poison_value(array.dtype)
    if value is None:
        array.view(np.uint8).fill(0xFF)
    else:
        array.fill(value)


def reset_output(array: Any, fill: str) -> None:
    """Prepare an output (or scratch) argument for a check, in place: zeros when its ``fill`` is
    ``zeros`` (an accumulating kernel: atomics, split-K, a sum), else :func:`poison`, so that an
    element the kernel never writes fails the check."""
    if fill == "zeros":
        array.fill(0)
    else:
        poison(array)


def fill_array(
    shape: tuple[int, ...], dtype: np.dtype[Any], fill: str, rng: np.random.Generator
) -> np.ndarray:
    """A host array filled as the experiment asks.

    ``random`` is uniform in [-1, 1) for floats (both parts for complex), small random integers
    for integers, coin flips for bools; ``randint`` is small integers in any dtype. A random
    array is never all zeros (a kernel that ignores its input would otherwise pass); ``zeros``
    and ``ones`` are taken literally, and ``output`` arrays start poisoned.
    """
    dtype = np.dtype(dtype)
    if fill == "zeros":
        return np.zeros(shape, dtype)
    if fill == "ones":
        return np.ones(shape, dtype)
    if fill == "output":
        array = np.empty(shape, dtype)
        poison(array)
        return array
    if fill not in ("random", "randint"):
        raise ValueError(f"unknown fill {fill!r}; expected random, randint, ones, zeros, output")
    if dtype.kind == "b":
        array = rng.random(shape) < 0.5
    elif fill == "random" and dtype.kind == "f":
        array = rng.uniform(-1.0, 1.0, shape).astype(dtype)
    elif fill == "random" and dtype.kind == "c":
        array = (rng.uniform(-1.0, 1.0, shape) + 1j * rng.uniform(-1.0, 1.0, shape)).astype(dtype)
    else:
        low, high = _UNSIGNED_RANGE if dtype.kind == "u" else _SIGNED_RANGE
        array = rng.integers(low, high, shape).astype(dtype)
    if array.size and not np.any(array):
        array.flat[0] = 1
    return array


def create_inputs(
    arguments: Sequence[ArgumentSpec], sizes: Mapping[str, int | float], seed: int
) -> dict[str, Any]:
    """Every kernel argument by name, on the host: arrays filled per :func:`fill_array` from one
    generator seeded with ``seed`` (so a restarted worker rebuilds the same inputs), scalars as
    NumPy scalars of their dtype (so the kernel receives exactly the declared width)."""
    rng = np.random.default_rng(seed)
    values: dict[str, Any] = {}
    for arg in arguments:
        dtype = np.dtype(arg.dtype)
        if arg.shape is not None:
            shape = tuple(expr.evaluate_int(sizes) for expr in arg.shape)
            values[arg.name] = fill_array(shape, dtype, arg.fill, rng)
        else:
            assert arg.value is not None  # the parser requires shape or value
            values[arg.name] = dtype.type(arg.value.evaluate(sizes))
    return values


def check_inputs(experiment: Experiment, values: Mapping[str, Any]) -> None:
    """Refuse inputs that are all zeros: never time a kernel on them.

    A kernel fed zeros draws less power and keeps higher clocks than on real data (so it times
    faster than it runs), and one that ignores an input still matches the reference. Outputs are
    poisoned before every check, so only the other array arguments count. Raises
    :class:`ExperimentError` naming the argument's ``fill`` key.
    """
    for index, arg in enumerate(experiment.arguments):
        if arg.output or arg.fill == "output" or arg.shape is None:
            continue
        array = values[arg.name]
        if array.size and not np.any(array):
            raise ExperimentError(
                experiment.path,
                f"arguments[{index}].fill",
                f"input {arg.name!r} is all zeros (fill = {arg.fill!r}); kernels are never timed "
                "on all-zero inputs, which draw less power and hide a kernel that ignores them: "
                'expected fill = "random", "randint" or "ones"',
            )


def relative_l2_error(output: Any, expected: Any, xp: Any = np) -> float:
    """‖output − expected‖ / ‖expected‖ over all elements, in double precision.

    ``inf`` when the output holds NaN or inf (an unwritten, poisoned element), so that any
    ``error <= rtol`` test fails. With an all-zero reference the absolute norm is returned, since
    no relative error exists. ``xp`` is the array module that does the arithmetic: NumPy for
    host arrays, CuPy where both arrays are on the GPU, so that checking a large output costs
    no copy to the host and no host pass over it (the same formula, only scalars come back).
    """
    out = xp.asarray(output)
    ref = xp.asarray(expected)
    if out.size != ref.size:
        raise ValueError(f"output has {out.size} elements but the reference has {ref.size}")
    wide = xp.complex128 if out.dtype.kind == "c" or ref.dtype.kind == "c" else xp.float64
    out = out.ravel().astype(wide, copy=False)
    ref = ref.ravel().astype(wide, copy=False)
    if not bool(xp.all(xp.isfinite(out))):
        return math.inf
    difference = float(xp.linalg.norm(out - ref))
    norm = float(xp.linalg.norm(ref))
    return difference / norm if norm > 0 else difference


def load_reference(spec: ReferenceSpec) -> Callable[..., Any]:
    """The reference function, imported from its file (which need not be on ``sys.path``)."""
    module_spec = importlib.util.spec_from_file_location(
        f"surrotune_reference_{spec.path.stem}", spec.path
    )
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import the reference file {spec.path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    function = getattr(module, spec.function, None)
    if not callable(function):
        raise AttributeError(f"{spec.path} defines no function {spec.function!r}")
    return function  # type: ignore[no-any-return]


def _to_numpy(value: Any) -> np.ndarray:
    """A reference may compute with CuPy or PyTorch; verification compares NumPy arrays."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch.Tensor
        return np.asarray(value.detach().cpu().numpy())
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # cupy.ndarray
        return np.asarray(value.get())
    return np.asarray(value)


def compute_expected(experiment: Experiment, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Call the reference once and check what it returns.

    The reference gets every argument by name (arrays as NumPy copies of their initial content,
    scalars as Python numbers), as docs/experiment.md says. It must return a dict with a finite
    array for every output argument, of the argument's size.
    """
    if experiment.reference is None:
        raise ValueError(f"{experiment.path}: [reference] is missing; the cuda backend needs it")
    function = load_reference(experiment.reference)
    kwargs = {
        name: value.copy() if isinstance(value, np.ndarray) else value.item()
        for name, value in inputs.items()
    }
    returned = function(**kwargs)
    where = f"{experiment.reference.path.name}:{experiment.reference.function}"
    if not isinstance(returned, Mapping):
        raise TypeError(
            f"{where} returned {type(returned).__name__}; expected a dict output name -> array"
        )
    outputs = [arg.name for arg in experiment.arguments if arg.output]
    unknown = sorted(set(returned) - set(outputs))
    if unknown:
        raise ValueError(f"{where} returned {unknown[0]!r}, which is not an output argument")
    expected: dict[str, np.ndarray] = {}
    for name in outputs:
        if name not in returned:
            raise ValueError(f"{where} returned no {name!r}; return every output argument")
        array = _to_numpy(returned[name])
        if array.size != inputs[name].size:
            raise ValueError(
                f"{where} returned {array.size} elements for {name!r}, "
                f"which has {inputs[name].size}"
            )
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{where} returned NaN or inf in {name!r}")
        expected[name] = array
    return expected


# --------------------------------------------------------------------------- CUDA error names

_ERROR_NAME = re.compile(r"\b(CUDA_ERROR_[A-Z0-9_]+|cudaError[A-Za-z0-9]+)\b")

#: runtime-API spellings whose driver-API equivalent is not the plain snake-case of the name
_RUNTIME_ALIASES = {
    "LAUNCH_FAILURE": "LAUNCH_FAILED",
    "MEMORY_ALLOCATION": "OUT_OF_MEMORY",
    "INVALID_CONFIGURATION": "INVALID_VALUE",
    "NO_KERNEL_IMAGE_FOR_DEVICE": "NO_BINARY_FOR_GPU",
    "INVALID_KERNEL_IMAGE": "INVALID_IMAGE",
    "SYMBOL_NOT_FOUND": "NOT_FOUND",
}
_RESOURCE_ERRORS = frozenset({"LAUNCH_OUT_OF_RESOURCES", "OUT_OF_MEMORY"})
#: errors that mean the binary cannot be used on this device: a build problem, not a launch
_IMAGE_ERRORS = frozenset(
    {"NO_BINARY_FOR_GPU", "INVALID_IMAGE", "INVALID_PTX", "UNSUPPORTED_PTX_VERSION", "NOT_FOUND"}
)
#: faults while the kernel runs; all of them leave the context unusable (sticky)
_RUNTIME_ERRORS = frozenset(
    {
        "ILLEGAL_ADDRESS",
        "MISALIGNED_ADDRESS",
        "LAUNCH_FAILED",
        "ILLEGAL_INSTRUCTION",
        "HARDWARE_STACK_ERROR",
        "ASSERT",
        "INVALID_PC",
        "INVALID_ADDRESS_SPACE",
        "LAUNCH_TIMEOUT",
        "ECC_UNCORRECTABLE",
        "CONTEXT_IS_DESTROYED",
        "UNKNOWN",
    }
)


def cuda_error_name(message: str) -> str | None:
    """The driver-API name (``ILLEGAL_ADDRESS``) in a CuPy driver or runtime error message."""
    match = _ERROR_NAME.search(message)
    if match is None:
        return None
    token = match.group(1)
    if token.startswith("CUDA_ERROR_"):
        return token.removeprefix("CUDA_ERROR_")
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", token.removeprefix("cudaError")).upper()
    return _RUNTIME_ALIASES.get(snake, snake)


def classify_cuda_error(message: str) -> Status:
    """The Status of a CUDA error, from the error name in its message.

    ``LAUNCH_OUT_OF_RESOURCES`` (and out of memory) is ``resource``; faults while running
    (illegal or misaligned address, trap, stack error, ...) are ``runtime`` and sticky; an image
    the device cannot load or a kernel missing from it is ``compile``; every other refusal
    (``INVALID_VALUE``, an invalid configuration) is ``launch``. A message without a CUDA error
    name is ``runtime``: the state of the context is unknown, so the worker is replaced.
    """
    name = cuda_error_name(message)
    if name is None or name in _RUNTIME_ERRORS:
        return Status.RUNTIME
    if name in _RESOURCE_ERRORS:
        return Status.RESOURCE
    if name in _IMAGE_ERRORS:
        return Status.COMPILE
    return Status.LAUNCH


# --------------------------------------------------------------------------- the CUDA worker


@dataclass(frozen=True)
class CudaWorkerInit:
    """What the CUDA worker needs to set up: the experiment and the GPU to use."""

    experiment: Experiment
    device_id: int = 0


@dataclass(frozen=True)
class LaunchJob:
    """One compiled configuration to verify and time. Dimensions are (x, y, z).

    ``repeats`` launches are timed after ``warmup`` untimed ones; with ``max_repeats`` above it,
    timing goes on until the median is known to ``target_precision`` or a cap is reached
    (:func:`surrotune.backends.measure.next_round`). The defaults time exactly ``repeats``
    launches without touching the L2, as every job did before adaptive timing.
    ``static_shared_bytes`` (the kernel's own, from the compiler) decides whether the dynamic
    size needs the opt-in attribute: static plus dynamic above 48 KB does.
    """

    cubin: bytes
    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    warmup: int
    repeats: int
    max_repeats: int | None = None
    target_precision: float = 0.01
    max_measure_s: float = 1.0
    l2_flush: str = "never"
    static_shared_bytes: int = 0

    @property
    def policy(self) -> MeasurePolicy:
        maximum = self.repeats if self.max_repeats is None else self.max_repeats
        return MeasurePolicy(
            warmup=self.warmup,
            min_repeats=self.repeats,
            max_repeats=max(maximum, self.repeats),
            target_precision=self.target_precision,
            max_seconds=self.max_measure_s,
        )


@dataclass(frozen=True)
class LaunchReply:
    """The worker's verdict on a :class:`LaunchJob`.

    For a timed job also: the precision reached (relative half-width of the median's 95 %
    interval), why timing stopped (a :data:`surrotune.backends.measure.STOP_REASONS` key),
    whether the L2 was flushed before each timed launch, and the clocks read while timing
    (:data:`surrotune.backends.clocks.CLOCK_FIELDS`; empty when no source works).
    """

    status: Status
    times_ms: tuple[float, ...] = ()
    verification_error: float | None = None
    error: str = ""
    benchmark_time_ms: float | None = None
    timing_precision: float | None = None
    timing_stop: str = ""
    l2_flush: bool | None = None
    clocks: dict[str, float] = field(default_factory=dict)


#: above this much shared memory per block, static plus dynamic, a kernel must opt in to its
#: dynamic size (cudaFuncAttributeMaxDynamicSharedMemorySize); the default limit of every GPU
_DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024

#: cudaDeviceProp fields reported by the worker: identity, the limits the occupancy calculator
#: (:mod:`surrotune.backends.occupancy`) reads, and the L2 size that decides the flush
DEVICE_PROPERTIES = (
    "name",
    "major",
    "minor",
    "multiProcessorCount",
    "maxThreadsPerBlock",
    "maxThreadsDim",
    "maxGridSize",
    "sharedMemPerBlock",
    "sharedMemPerBlockOptin",
    "sharedMemPerMultiprocessor",
    "reservedSharedMemPerBlock",
    "regsPerBlock",
    "regsPerMultiprocessor",
    "maxThreadsPerMultiProcessor",
    "maxBlocksPerMultiProcessor",
    "l2CacheSize",
    "persistingL2CacheMaxSize",
    "warpSize",
    "totalGlobalMem",
    "memoryBusWidth",
    "clockRate",
    "memoryClockRate",
)
#: cudaDeviceAttr numbers, for properties CUDA 13 removed from cudaDeviceProp (the clock rates)
#: and for those an older CuPy does not copy out of it
_ATTRIBUTES = {
    "clockRate": 13,
    "multiProcessorCount": 16,
    "memoryClockRate": 36,
    "memoryBusWidth": 37,
    "l2CacheSize": 38,
    "maxThreadsPerMultiProcessor": 39,
    "sharedMemPerMultiprocessor": 81,
    "regsPerMultiprocessor": 82,
    "sharedMemPerBlockOptin": 97,
    "maxBlocksPerMultiProcessor": 106,
    "persistingL2CacheMaxSize": 108,
    "reservedSharedMemPerBlock": 111,
}
#: the L2 flush buffer when the device does not report its L2 size (twice the largest L2 yet)
_FALLBACK_FLUSH_BYTES = 256 * 1024 * 1024


def _plain(value: Any) -> Any:
    """A device property as JSON-friendly Python (bytes names, tuples of dimensions)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\0")
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def device_properties(cupy: Any, device_id: int) -> dict[str, Any]:
    """The limits and identity of the GPU, as plain Python values."""
    runtime = cupy.cuda.runtime
    raw = runtime.getDeviceProperties(device_id)
    props: dict[str, Any] = {}
    for key in DEVICE_PROPERTIES:
        if key in raw:
            props[key] = _plain(raw[key])
        elif key in _ATTRIBUTES:
            try:
                props[key] = int(runtime.deviceGetAttribute(_ATTRIBUTES[key], device_id))
            except Exception:
                props[key] = None
        else:
            props[key] = None
    props["device_id"] = device_id
    props["arch"] = f"sm_{props['major']}{props['minor']}"
    props["runtime_version"] = int(runtime.runtimeGetVersion())
    props["driver_version"] = int(runtime.driverGetVersion())
    try:
        props["pciBusId"] = str(runtime.deviceGetPCIBusId(device_id))
    except Exception:  # not every runtime build exposes it; NVML then goes by index
        props["pciBusId"] = None
    return props


def cuda_worker(init: CudaWorkerInit) -> tuple[dict[str, Any], Callable[[LaunchJob], Any]]:
    """The :data:`WorkerTarget` that owns the CUDA context (runs in the child only).

    Setup builds the arguments on the host, computes the expected outputs with the reference,
    copies the arguments to the GPU and answers with :func:`device_properties`. Each job is then
    answered by :meth:`_CudaState.run`.
    """
    import cupy

    experiment = init.experiment
    cupy.cuda.Device(init.device_id).use()
    host = create_inputs(experiment.arguments, experiment.sizes, experiment.evaluation.seed)
    check_inputs(experiment, host)
    expected = compute_expected(experiment, host)
    rtol = experiment.reference.rtol if experiment.reference is not None else 0.0
    device = {
        name: cupy.asarray(value) if isinstance(value, np.ndarray) else value
        for name, value in host.items()
    }
    state = _CudaState(
        cupy=cupy,
        args=tuple(device[arg.name] for arg in experiment.arguments),
        poisoned={
            arg.name: device[arg.name]
            for arg in experiment.arguments
            if arg.output or arg.fill == "output"
        },
        fills={arg.name: arg.fill for arg in experiment.arguments},
        expected=expected,
        expected_on_device=expected_on_device(cupy, expected),
        rtol=rtol,
    )
    cupy.cuda.Device().synchronize()
    props = device_properties(cupy, init.device_id)
    state.working_set_bytes = sum(
        int(value.nbytes) for value in device.values() if getattr(value, "ndim", 0) > 0
    )
    state.l2_bytes = props.get("l2CacheSize") or None
    state.clocks = open_clock_reader(props.get("pciBusId"), init.device_id)
    props["clocks"] = {
        "source": state.clocks.source,
        "note": state.clocks.note,
        "at_start": state.clocks.start().result(),
    }
    props["working_set_bytes"] = state.working_set_bytes
    return props, state.run


#: the device-side check may take at most this share of the GPU's free memory: the reference in
#: double precision plus two temporaries of its size (the output widened, the difference)
_DEVICE_CHECK_SHARE = 0.5


def expected_on_device(cupy: Any, expected: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """The expected outputs copied to the GPU once, or None where they would crowd it.

    Checking a large output on the host costs a copy of it to the host and a pass over it in
    double precision there, on one CPU core, for every trial: for a 4096 x 4096 float32 output
    that is longer than timing most kernels ten times (docs/BENCHMARKS.md). On the GPU it is a
    few passes at memory bandwidth. Where the reference and the check's two temporaries would
    take more than half the free GPU memory, the check stays on the host.
    """
    wide = sum(np.dtype(np.complex128 if a.dtype.kind == "c" else np.float64).itemsize * a.size
               for a in expected.values())  # fmt: skip
    try:
        free, _total = cupy.cuda.runtime.memGetInfo()
        if 3 * wide > _DEVICE_CHECK_SHARE * free:
            return None
        return {name: cupy.asarray(array) for name, array in expected.items()}
    except cupy.cuda.memory.OutOfMemoryError:
        return None


@dataclass
class _CudaState:
    """The worker's GPU-side state and the job loop body."""

    cupy: Any
    args: tuple[Any, ...]
    poisoned: dict[str, Any]  # outputs (and scratch buffers), reset before each check
    expected: dict[str, np.ndarray]  # by output name
    rtol: float
    #: the same on the GPU, where the check then runs (None: checked on the host)
    expected_on_device: dict[str, Any] | None = None
    working_set_bytes: int = 0  # every array argument: what a launch touches at most
    l2_bytes: int | None = None
    clocks: ClockReader = field(default_factory=lambda: NoClocks("not opened"))
    flush_buffer: Any = None  # allocated on the first job that flushes the L2
    #: fill by argument name: "zeros" outputs are zeroed before a check, the others poisoned
    fills: dict[str, str] = field(default_factory=dict)

    def run(self, job: LaunchJob) -> LaunchReply | Retire:
        """Load, launch once and verify, then time; a sticky error retires the worker."""
        started = time.perf_counter()
        cupy = self.cupy
        cuda_errors = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)

        def answer(status: Status, error: str = "", **fields: Any) -> LaunchReply | Retire:
            reply = LaunchReply(
                status,
                error=error,
                benchmark_time_ms=(time.perf_counter() - started) * 1e3,
                **fields,
            )
            return Retire(reply) if status is Status.RUNTIME else reply

        phase = "loading the cubin"
        try:
            module = cupy.cuda.function.Module()
            module.load(job.cubin)
            phase = f"looking up the kernel {job.kernel_name!r}"
            function = module.get_function(job.kernel_name)
            shared = job.static_shared_bytes + job.dynamic_shared_bytes
            if job.dynamic_shared_bytes and shared > _DEFAULT_DYNAMIC_SHARED_LIMIT:
                phase = "opting in to dynamic shared memory"
                # CuPy 14: Function has no settable attribute; set it through the driver
                cupy.cuda.driver.funcSetAttribute(
                    function.ptr,
                    cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    job.dynamic_shared_bytes,
                )

            def launch() -> None:
                function(job.grid, job.block, self.args, shared_mem=job.dynamic_shared_bytes)

            phase = "preparing the outputs"
            for name, array in self.poisoned.items():
                reset_output(array, self.fills.get(name, "output"))
            phase = "launching"
            launch()
            phase = "running"
            cupy.cuda.Device().synchronize()
            phase = "checking the outputs"
            errors = self._errors()
            worst = max(errors.values(), default=0.0)
            failures = [
                self._describe(name, error)
                for name, error in errors.items()
                if not error <= self.rtol  # NaN fails too
            ]
            if failures:
                return answer(Status.CORRECTNESS, "; ".join(failures), verification_error=worst)
            phase = "warming up"
            for _ in range(job.warmup):
                launch()
            phase = "timing"
            timing = self._time(job, launch)
        except cuda_errors as exc:
            return answer(classify_cuda_error(str(exc)), f"{phase}: {exc}")
        except Exception:
            return answer(Status.RUNTIME, f"{phase}: {traceback.format_exc()}")
        return answer(Status.OK, verification_error=worst, **timing)

    def _errors(self) -> dict[str, float]:
        """Each output's relative L2 error against the reference, on the GPU where it fits."""
        cupy = self.cupy
        if self.expected_on_device is not None:
            try:
                return {
                    name: relative_l2_error(self.poisoned[name], expected, xp=cupy)
                    for name, expected in self.expected_on_device.items()
                }
            except cupy.cuda.memory.OutOfMemoryError:
                # the temporaries did not fit beside this configuration's needs: host from now on
                self.expected_on_device = None
                cupy.get_default_memory_pool().free_all_blocks()
        return {
            name: relative_l2_error(self.poisoned[name].get(), expected)
            for name, expected in self.expected.items()
        }

    def _time(self, job: LaunchJob, launch: Callable[[], None]) -> dict[str, Any]:
        """Time launches in rounds until :func:`next_round` says stop; every time is kept.

        Each timed launch sits between its own pair of events; the L2 flush (a memset of twice
        the L2 on the same stream) comes before the start event, so it is never timed. The
        clocks are read while the first round runs.
        """
        cupy = self.cupy
        policy = job.policy
        flush = self._flusher(job)
        times: list[float] = []
        pending = None
        started = time.perf_counter()
        while True:
            plan = next_round(policy, times, time.perf_counter() - started)
            if plan.count == 0:
                break
            events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(plan.count)]
            for start, end in events:
                if flush is not None:
                    flush()
                start.record()
                launch()
                end.record()
            if pending is None:
                pending = self.clocks.start()
            events[-1][1].synchronize()
            times.extend(cupy.cuda.get_elapsed_time(start, end) for start, end in events)
        return {
            "times_ms": tuple(times),
            "timing_precision": plan.precision,
            "timing_stop": plan.reason,
            "l2_flush": flush is not None,
            "clocks": pending.result() if pending is not None else {},
        }

    def _flusher(self, job: LaunchJob) -> Callable[[], None] | None:
        """A memset of a scratch buffer twice the L2's size, or None when not flushing."""
        if not choose_l2_flush(job.l2_flush, self.working_set_bytes, self.l2_bytes):
            return None
        cupy = self.cupy
        if self.flush_buffer is None:
            size = 2 * self.l2_bytes if self.l2_bytes else _FALLBACK_FLUSH_BYTES
            self.flush_buffer = cupy.empty(size, dtype=cupy.uint8)
        pointer, size = self.flush_buffer.data.ptr, self.flush_buffer.nbytes
        memset = cupy.cuda.runtime.memsetAsync

        def flush() -> None:
            memset(pointer, 0, size, cupy.cuda.get_current_stream().ptr)

        return flush

    def _describe(self, name: str, error: float) -> str:
        if math.isinf(error) or math.isnan(error):
            return (
                f"output {name!r} holds NaN or inf (elements the kernel did not write keep "
                "their poison)"
            )
        return f"output {name!r}: relative L2 error {error:.3g} exceeds rtol {self.rtol:g}"
