"""Compile kernels with NVRTC, in a pool of processes over all CPU cores.

nvcc costs about a second per kernel, most of it process start-up and the host-side passes a
kernel template never needs; NVRTC runs the same front end and ptxas inside the calling process,
so a compile costs what the kernel costs. That is what lets the CPU cores keep up with the GPU.

Three parts live here:

* :func:`find_nvrtc` locates ``libnvrtc`` without CuPy (``CUDA_HOME``/``CUDA_PATH``, the
  ``/usr/local/cuda*`` toolkits, the ``nvidia-cuda-nvrtc`` wheel, the dynamic loader), so the
  same path runs on CI where only the toolkit or the wheel exists;
* :class:`NvrtcLibrary` is a ctypes binding of the dozen calls a compile needs. It asks for a
  cubin directly (``--gpu-architecture=sm_XY``, then ``nvrtcGetCUBIN``) with ptxas' verbose
  report in the log, which :func:`surrotune.backends.compile.parse_ptxas_report` reads exactly as
  it reads nvcc's; the kernel's symbol comes from ``nvrtcGetLoweredName``, so a kernel need not
  be ``extern "C"``;
* :class:`NvrtcCompiler` runs compiles in child processes, each of which loads the library once.
  Each child takes one compile at a time under a deadline: a compile that hangs is killed with
  its process, costs its configuration one ``timeout`` trial, and the child is replaced. Results
  go to the same disk cache as nvcc's (the key names the compiler, its version and its path).

NVRTC compiles device code only, so two nvcc habits are translated (:func:`nvrtc_options`):
nvcc's ``-O<n>`` (host optimisation) is dropped, and unannotated functions are device functions
(``--device-as-default-execution-space``), which lets NVRTC accept the ``constexpr`` helpers that
nvcc compiles for the host and evaluates at compile time.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import glob
import importlib.util
import itertools
import multiprocessing
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from surrotune.backends.compile import (
    _ENTRY,
    _RESOURCE,
    CompiledKernel,
    CompileError,
    CompileRequest,
    _read_cache,
    _useful_lines,
    _write_cache,
    kernel_resources,
    usable_cpus,
)
from surrotune.errors import SurrotuneError

__all__ = [
    "NvrtcCompiler",
    "NvrtcError",
    "NvrtcLibrary",
    "NvrtcNotFound",
    "find_nvrtc",
    "nvrtc_options",
]

#: nvrtcResult codes that matter here (the rest are reported by name)
_SUCCESS = 0
_ERROR_INVALID_OPTION = 5
_ERROR_COMPILATION = 6

#: how long a compile child may take to import and load the library before it counts as broken
_START_TIMEOUT_S = 300.0
#: how long a killed child may take to go
_KILL_WAIT_S = 10.0
#: niceness of the compile children: the measuring worker and the sampler come first
_CHILD_NICENESS = 5
#: children in a row that may die while starting (a Ctrl-C during their imports, say) before
#: NVRTC counts as unusable here
_MAX_START_DEATHS = 3


class NvrtcError(SurrotuneError, RuntimeError):
    """NVRTC cannot compile anything as set up: an option it does not know, a broken install.

    Not a property of one configuration, so it is raised instead of being recorded as a trial.
    """


class NvrtcNotFound(NvrtcError, FileNotFoundError):
    """``libnvrtc`` is not installed where surrotune looks for it."""


# --------------------------------------------------------------------------- finding the library

#: set as the interpreter exits, before multiprocessing stops its daemon children (atexit runs
#: the handlers registered last first): from then on no dispatcher starts a child, for a child
#: started while its parent exits dies reading its start-up data ("EOFError: Ran out of input")
_EXITING = threading.Event()
atexit.register(_EXITING.set)

_LIBRARY_GLOBS = ("libnvrtc.so", "libnvrtc.so.*[0-9]", "nvrtc64_*.dll")


def _toolkit_dirs() -> Iterator[Path]:
    """Library folders of CUDA toolkits: the environment's first, then the newest install."""
    roots: list[Path] = [
        Path(os.environ[name]) for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)
    ]
    roots.append(Path("/usr/local/cuda"))
    versioned = glob.glob("/usr/local/cuda-*")
    roots.extend(Path(p) for p in sorted(versioned, key=_version_key, reverse=True))
    for root in roots:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "bin"):
            yield root / sub


def _wheel_dirs() -> Iterator[Path]:
    """Library folders of NVIDIA's pip wheels (``nvidia-cuda-nvrtc``: ``nvidia/cu13/lib`` for
    CUDA 13, ``nvidia/cuda_nvrtc/lib`` for CUDA 12), newest CUDA first."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    if spec is None or spec.submodule_search_locations is None:
        return
    for base in spec.submodule_search_locations:
        found = glob.glob(os.path.join(base, "cu*", "lib")) + glob.glob(
            os.path.join(base, "cuda_nvrtc", "lib")
        )
        for directory in sorted(
            found, key=lambda d: _version_key(str(Path(d).parent)), reverse=True
        ):
            yield Path(directory)


def _version_key(path: str) -> tuple[int, ...]:
    """The numbers in a file or folder name, for "newest first" (``cuda-13.0`` > ``cuda-12.8``)."""
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).name))


def _library_in(directory: Path) -> Path | None:
    """The NVRTC library in ``directory``: the highest versioned name, else the plain one."""
    if not directory.is_dir():
        return None
    candidates: list[str] = []
    for pattern in _LIBRARY_GLOBS:
        candidates.extend(glob.glob(str(directory / pattern)))
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    if not candidates:
        return None
    return Path(max(candidates, key=lambda c: (_version_key(Path(c).name), c)))


def find_nvrtc(library: str | os.PathLike[str] | None = None) -> str:
    """The path (or loader name) of ``libnvrtc``.

    Looks, in order: at ``library`` when given, ``$CUDA_HOME`` and ``$CUDA_PATH``,
    ``/usr/local/cuda`` and ``/usr/local/cuda-*`` (newest first), the ``nvidia-cuda-nvrtc`` wheel,
    and finally the dynamic loader's own search (``ctypes.util.find_library``).

    Raises:
        NvrtcNotFound: none was found; the message says how to get one.
    """
    if library is not None:
        path = Path(library)
        if path.is_file():
            return str(path)
        found = _library_in(path)
        if found is not None:
            return str(found)
        raise NvrtcNotFound(f"no NVRTC library at {str(path)!r}: expected libnvrtc.so* there")
    for directory in itertools.chain(_toolkit_dirs(), _wheel_dirs()):
        found = _library_in(directory)
        if found is not None:
            return str(found)
    name = ctypes.util.find_library("nvrtc")
    if name is not None:
        return name
    raise NvrtcNotFound(
        "NVRTC (libnvrtc) was not found in $CUDA_HOME, /usr/local/cuda*, the nvidia-cuda-nvrtc "
        "wheel or the loader's path; install the CUDA toolkit or `pip install "
        'nvidia-cuda-nvrtc`, or set [kernel] compiler = "nvcc" in the experiment'
    )


# --------------------------------------------------------------------------- the binding


def nvrtc_options(options: Sequence[str], arch: str) -> list[str]:
    """NVRTC's command line for a request: ``options`` translated from nvcc habits, then the
    architecture, ptxas' verbose report and device-by-default execution space.

    nvcc's ``-O<n>`` sets the *host* optimisation level, so it is dropped; ``-Xptxas V`` becomes
    ``--ptxas-options=V``, and the two-word ``-D X``, ``-I X``, ``-U X`` and ``-maxrregcount N``
    become one word, since NVRTC takes each option as a single string.
    """
    translated: list[str] = []
    words = list(options)
    i = 0
    while i < len(words):
        word = words[i]
        following = words[i + 1] if i + 1 < len(words) else None
        if re.fullmatch(r"-O\d?|--optimize(=\d)?", word):
            pass
        elif word in ("-Xptxas", "--ptxas-options") and following is not None:
            translated.append(f"--ptxas-options={following}")
            i += 1
        elif word.startswith("-Xptxas="):
            translated.append("--ptxas-options=" + word.removeprefix("-Xptxas="))
        elif word in ("-D", "-I", "-U") and following is not None:
            translated.append(word + following)
            i += 1
        elif word in ("-maxrregcount", "--maxrregcount") and following is not None:
            translated.append(f"--maxrregcount={following}")
            i += 1
        else:
            translated.append(word)
        i += 1
    return [
        *translated,
        f"--gpu-architecture={arch}",
        "--ptxas-options=-v",
        "--device-as-default-execution-space",
    ]


def _preload_builtins(library: str) -> None:
    """NVRTC opens ``libnvrtc-builtins`` by name at the first compile, which fails when it lies
    next to a wheel's or a toolkit's libnvrtc that is not on the loader's path: load it first,
    globally, from the same folder."""
    directory = Path(library).parent
    if not directory.is_dir() or str(directory) in ("", "."):
        return
    candidates = [
        c for c in glob.glob(str(directory / "libnvrtc-builtins.so*")) if ".alt." not in c
    ]
    newest_first = sorted(candidates, key=lambda c: (_version_key(Path(c).name), c), reverse=True)
    for candidate in newest_first:
        with contextlib.suppress(OSError):
            ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            return


class NvrtcLibrary:
    """The NVRTC calls a compile needs, through ctypes. One per process.

    Args:
        library: a path or loader name from :func:`find_nvrtc`.
    """

    def __init__(self, library: str) -> None:
        self.path = library
        _preload_builtins(library)
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise NvrtcNotFound(f"cannot load NVRTC from {library!r}: {exc}") from None
        lib = self._lib
        program = ctypes.c_void_p
        pointer = ctypes.POINTER
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        signatures: dict[str, list[Any]] = {
            "nvrtcVersion": [pointer(ctypes.c_int), pointer(ctypes.c_int)],
            "nvrtcCreateProgram": [
                pointer(program),
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.c_int,
                pointer(ctypes.c_char_p),
                pointer(ctypes.c_char_p),
            ],
            "nvrtcAddNameExpression": [program, ctypes.c_char_p],
            "nvrtcCompileProgram": [program, ctypes.c_int, pointer(ctypes.c_char_p)],
            "nvrtcGetProgramLogSize": [program, pointer(ctypes.c_size_t)],
            "nvrtcGetProgramLog": [program, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [program, pointer(ctypes.c_size_t)],
            "nvrtcGetCUBIN": [program, ctypes.c_char_p],
            "nvrtcGetLoweredName": [program, ctypes.c_char_p, pointer(ctypes.c_char_p)],
            "nvrtcDestroyProgram": [pointer(program)],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.restype = ctypes.c_int
            function.argtypes = argtypes

    @property
    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        return major.value, minor.value

    @property
    def version_text(self) -> str:
        """What the cache key holds: the version, and the file (so two installs of one version
        with different builds do not share entries)."""
        major, minor = self.version
        where = os.path.realpath(self.path) if os.path.exists(self.path) else self.path
        size = os.path.getsize(where) if os.path.exists(where) else 0
        return f"nvrtc {major}.{minor} {where} {size}"

    def _error(self, code: int) -> str:
        text = self._lib.nvrtcGetErrorString(code)
        return text.decode() if text else f"nvrtcResult {code}"

    def _check(self, code: int, what: str) -> None:
        if code != _SUCCESS:
            raise NvrtcError(f"NVRTC {what} failed: {self._error(code)}")

    def compile(self, request: CompileRequest) -> tuple[CompiledKernel | CompileError, bool]:
        """Compile ``request`` to a cubin; the flag says whether the outcome may be cached.

        Raises:
            NvrtcError: NVRTC refused the options or failed for a reason that is not the
                source's (a missing builtins library): every other request would fail alike.
        """
        lib = self._lib
        program = ctypes.c_void_p()
        self._check(
            lib.nvrtcCreateProgram(
                ctypes.byref(program), request.source.encode(), b"kernel.cu", 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            name = request.kernel_name.encode()
            self._check(lib.nvrtcAddNameExpression(program, name), "nvrtcAddNameExpression")
            options = nvrtc_options(request.options, request.arch)
            argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
            started = time.perf_counter()
            code = lib.nvrtcCompileProgram(program, len(options), argv)
            elapsed_ms = (time.perf_counter() - started) * 1e3
            log = self._log(program)
            if code == _ERROR_INVALID_OPTION:
                raise NvrtcError(
                    f"NVRTC refused the options {options}: {log.strip() or self._error(code)}; "
                    "fix [kernel] options (they are nvcc's only where NVRTC shares them)"
                )
            if code == _ERROR_COMPILATION:
                return self._failure(request, log, elapsed_ms), True
            self._check(code, "nvrtcCompileProgram")
            lowered = ctypes.c_char_p()
            self._check(
                lib.nvrtcGetLoweredName(program, name, ctypes.byref(lowered)),
                "nvrtcGetLoweredName",
            )
            symbol = (lowered.value or name).decode()
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
            if size.value == 0:
                message = (
                    f"NVRTC produced no cubin for arch {request.arch!r}; a cubin needs a real "
                    "architecture such as sm_90"
                )
                return CompileError(message, compile_time_ms=elapsed_ms, log=log), True
            buffer = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(program, buffer), "nvrtcGetCUBIN")
            cubin = buffer.raw[: size.value]
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))
        return _kernel(request, symbol, cubin, log, elapsed_ms), True

    def _log(self, program: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._check(
            self._lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "nvrtcGetProgramLogSize"
        )
        buffer = ctypes.create_string_buffer(max(size.value, 1))
        self._check(self._lib.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
        # ptxas' report and its errors arrive as separate NUL-terminated strings
        return buffer.raw[: size.value].replace(b"\0", b"").decode("utf-8", "replace")

    @staticmethod
    def _failure(request: CompileRequest, log: str, elapsed_ms: float) -> CompileError:
        if "__nv_name_map" in log:  # the name expression added for the kernel did not resolve
            message = (
                f"the source has no kernel {request.kernel_name!r} (NVRTC could not resolve the "
                f"name):\n{_useful_lines(log)}"
            )
            return CompileError(message, compile_time_ms=elapsed_ms, log=log)
        return CompileError(
            _useful_lines(log),
            compile_time_ms=elapsed_ms,
            is_resource=bool(_RESOURCE.search(log)),
            log=log,
        )


def _kernel(
    request: CompileRequest, symbol: str, cubin: bytes, log: str, elapsed_ms: float
) -> CompiledKernel | CompileError:
    """The compiled kernel with its resources, read as for nvcc (ptxas report, then the cubin)."""
    resources = kernel_resources(log, cubin, symbol)
    if resources is None:
        compiled = sorted({m[1] for m in _ENTRY.finditer(log)})
        message = (
            f"NVRTC's report has no entry function {symbol!r} for the kernel "
            f"{request.kernel_name!r} (it has: {', '.join(compiled) or 'none'})"
        )
        return CompileError(message, compile_time_ms=elapsed_ms, log=log)
    return CompiledKernel(
        cubin=cubin,
        kernel_name=symbol,
        resources=resources,
        compile_time_ms=elapsed_ms,
        log=log,
    )


# --------------------------------------------------------------------------- the compile children


def _serve(conn: Connection, library: str, cache_dir: str | None) -> None:
    """A compile child: load NVRTC once, say hello, then compile requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    with contextlib.suppress(OSError):
        os.nice(_CHILD_NICENESS)
    try:
        nvrtc = NvrtcLibrary(library)
        version = nvrtc.version_text
    except BaseException as exc:
        conn.send(("failed", _picklable(exc)))
        return
    conn.send(("ready", version))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        key, request = job
        try:
            outcome, cacheable = nvrtc.compile(request)
        except Exception as exc:
            conn.send(("error", _picklable(exc)))
            continue
        if cache_dir is not None and cacheable:
            with contextlib.suppress(OSError):
                _write_cache(Path(cache_dir), key, request.kernel_name, outcome)
        conn.send(("done", outcome))


def _picklable(exc: BaseException) -> BaseException:
    """An exception that survives the pipe: NVRTC's own, or its text in an NvrtcError."""
    if isinstance(exc, NvrtcError):
        return exc
    return NvrtcError(f"{type(exc).__name__}: {exc}")


@dataclass
class _Job:
    key: str
    request: CompileRequest
    future: Future[CompiledKernel | CompileError]


@dataclass
class _Child:
    """One compile process and the job it is working on."""

    process: Any  # multiprocessing.context.SpawnProcess
    conn: Connection
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    job: _Job | None = None
    deadline: float = 0.0


class NvrtcCompiler:
    """Compiles :class:`CompileRequest` s with NVRTC in up to ``workers`` child processes.

    :meth:`submit` returns at once with a future of the compiled kernel or its CompileError (never
    raised: a failing configuration is a result). A thread in this process hands queued requests
    to idle children and enforces ``timeout_s`` per compile. Satisfies
    :class:`surrotune.backends.compile.KernelCompiler`.

    Args:
        library: libnvrtc's path; None finds it (:func:`find_nvrtc`).
        cache_dir: the disk cache shared with nvcc's compiles (None: no cache).
        timeout_s: how long one compile may run before its process is killed (``timeout``).
        workers: child processes (None: one per CPU core this process may use).
    """

    name = "nvrtc"

    def __init__(
        self,
        *,
        library: str | os.PathLike[str] | None = None,
        cache_dir: Path | None = None,
        timeout_s: float = 120.0,
        workers: int | None = None,
    ) -> None:
        self.library = find_nvrtc(library)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.timeout_s = timeout_s
        self.workers = max(1, workers or usable_cpus())
        self._version: str | None = None
        self._start_deaths = 0
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._children: list[_Child] = []
        self._broken: NvrtcError | None = None
        self._closed = False
        self._woken = False
        self._wake_r, self._wake_w = self._context.Pipe(duplex=False)
        self._thread: threading.Thread | None = None
        self._warm = False  # start every child now, not as the queue grows
        self.started_processes = 0  #: children started so far (replacements included)

    @property
    def version(self) -> str:
        """NVRTC's version and file, as the cache key holds them (loads the library here)."""
        if self._version is None:
            self._version = NvrtcLibrary(self.library).version_text
        return self._version

    def warm_up(self) -> None:
        """Start all ``workers`` children now, in the background, so that their start (spawn,
        import, loading NVRTC: about a second with 16 at once) overlaps the GPU worker's and the
        sampler's, instead of delaying the first batch's compiles."""
        with self._lock:
            if self._closed:
                return
            self._warm = True
            self._start_dispatcher()
        self._wake()

    def _start_dispatcher(self) -> None:
        """Start the dispatcher thread once (the caller holds the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._dispatch, name="surrotune-nvrtc", daemon=True
            )
            self._thread.start()

    def submit(self, request: CompileRequest) -> Future[CompiledKernel | CompileError]:
        """Start compiling ``request``; a cache hit is answered at once."""
        future: Future[CompiledKernel | CompileError] = Future()
        key = request.cache_key(self.version)
        if self.cache_dir is not None:
            try:
                hit = _read_cache(self.cache_dir, key, request.kernel_name)
            except CompileError as error:
                hit = error
            if hit is not None:
                future.set_result(hit)
                return future
        with self._lock:
            if self._closed:
                raise RuntimeError("the NVRTC compiler is closed")
            if self._broken is not None:
                future.set_exception(self._broken)
                return future
            self._queue.append(_Job(key, request, future))
            self._start_dispatcher()
        self._wake()
        return future

    def close(self) -> None:
        """Stop the children; pending futures are cancelled. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join()
        for job in self._queue:
            job.future.cancel()
        self._queue.clear()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> NvrtcCompiler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the dispatcher thread

    def _wake(self) -> None:
        with self._lock:
            if self._woken or self._wake_w.closed:
                return
            self._woken = True
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"!")

    def _dispatch(self) -> None:
        try:
            while not self._closed and not _EXITING.is_set():
                self._assign()
                self._wait_and_collect()
        except BaseException as exc:  # never leave a future hanging
            self._fail_all(NvrtcError(f"the NVRTC dispatcher failed: {exc!r}"))
        finally:
            for child in list(self._children):
                self._stop(child, kill=child.job is not None)
                if child.job is not None and not child.job.future.done():
                    child.job.future.set_exception(RuntimeError("the NVRTC compiler was closed"))

    def _assign(self) -> None:
        """Give queued jobs to ready idle children, starting children up to ``workers``."""
        with self._lock:
            queued = len(self._queue)
        idle = [c for c in self._children if c.ready and c.job is None]
        starting = sum(1 for c in self._children if not c.ready)
        wanted = self.workers if self._warm else queued - len(idle) - starting
        for _ in range(min(wanted, self.workers - len(self._children))):
            if _EXITING.is_set():
                return
            self._spawn()
        for child in idle:
            job = self._next_job()
            if job is None:
                break
            child.job = job
            child.deadline = time.monotonic() + self.timeout_s
            with contextlib.suppress(OSError):  # if it died, its sentinel says so
                child.conn.send((job.key, job.request))

    def _next_job(self) -> _Job | None:
        with self._lock:
            while self._queue:
                job = self._queue.popleft()
                if job.future.set_running_or_notify_cancel():
                    return job
        return None

    def _spawn(self) -> None:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_serve,
            args=(child_conn, self.library, str(self.cache_dir) if self.cache_dir else None),
            name="surrotune-nvrtc",
            daemon=True,
        )
        process.start()
        child_conn.close()  # only the child holds its end: its death shows up as EOF
        self._children.append(_Child(process, parent_conn))
        self.started_processes += 1

    def _wait_and_collect(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self._children if c.job is not None]
        deadlines += [c.started + _START_TIMEOUT_S for c in self._children if not c.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        handles: list[Any] = [self._wake_r]
        for child in self._children:
            handles += [child.conn, child.process.sentinel]
        wait(handles, timeout)
        with self._lock:
            self._woken = False
        while self._wake_r.poll():
            self._wake_r.recv_bytes()
        for child in list(self._children):
            self._collect(child)

    def _collect(self, child: _Child) -> None:
        """Read what ``child`` sent, or notice that it died or ran past its deadline."""
        message: Any = None
        if child.conn.poll():
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                message = "died"
        elif not child.process.is_alive():
            message = "died"
        if message is None:
            now = time.monotonic()
            if child.job is not None and now >= child.deadline:
                job = child.job
                self._stop(child, kill=True)
                self._finish(
                    job,
                    CompileError(
                        f"NVRTC did not finish within {self.timeout_s:g} s; its process was "
                        "killed",
                        compile_time_ms=self.timeout_s * 1e3,
                        timed_out=True,
                    ),
                )
            elif not child.ready and now >= child.started + _START_TIMEOUT_S:
                self._stop(child, kill=True)
                self._break(NvrtcError(f"an NVRTC process did not start in {_START_TIMEOUT_S} s"))
            return
        if message == "died":
            job = child.job
            code = child.process.exitcode
            self._stop(child, kill=True)
            if job is not None:  # a crash in the compiler: that configuration's, not cached
                error = CompileError(f"the NVRTC process died (exit code {code}) compiling it")
                self._finish(job, error)
            elif not child.ready:
                self._start_deaths += 1
                if self._start_deaths >= _MAX_START_DEATHS:
                    message = f"{self._start_deaths} NVRTC processes died while starting"
                    self._break(NvrtcError(f"{message} (the last with exit code {code})"))
            return
        tag, value = message
        if tag == "ready":
            child.ready = True
            self._start_deaths = 0
            if self._version is None:
                self._version = value
        elif tag == "failed":
            self._stop(child, kill=True)
            self._break(value if isinstance(value, NvrtcError) else NvrtcError(str(value)))
        elif tag in ("done", "error") and child.job is not None:
            job, child.job = child.job, None
            if tag == "done":
                self._finish(job, value)
            elif not job.future.done():
                job.future.set_exception(value)

    @staticmethod
    def _finish(job: _Job, outcome: CompiledKernel | CompileError) -> None:
        if not job.future.done():
            job.future.set_result(outcome)

    def _stop(self, child: _Child, *, kill: bool) -> None:
        if child in self._children:
            self._children.remove(child)
        if child.process.is_alive():
            if kill:
                child.process.kill()
            else:
                with contextlib.suppress(OSError):
                    child.conn.send(None)
            child.process.join(_KILL_WAIT_S)
            if child.process.is_alive():
                child.process.kill()
                child.process.join(_KILL_WAIT_S)
        child.conn.close()

    def _break(self, error: NvrtcError) -> None:
        """NVRTC cannot work here: fail what is queued and every later submit with ``error``."""
        with self._lock:
            self._broken = error
        self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            jobs = list(self._queue)
            self._queue.clear()
        for job in jobs:
            if not job.future.done() and job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)
