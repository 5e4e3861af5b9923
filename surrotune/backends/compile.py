"""Compile a rendered kernel to a cubin and read what it costs in hardware resources.

This is the part of the CUDA backend that needs no GPU: it runs wherever nvcc or NVRTC is
installed, so compile failures and resource usage can be tested and recorded on CI, and a batch
can be compiled on the CPU cores while the GPU measures the previous one. Both compilers sit
behind one :class:`KernelCompiler` interface (``submit`` a request, get a future of its outcome):
:class:`NvccCompiler` here (nvcc is a subprocess, so threads are enough for parallelism) and
:class:`surrotune.backends.nvrtc.NvrtcCompiler` (processes, since NVRTC runs in-process);
:func:`make_compiler` picks one by the experiment's ``kernel.compiler``.

Resource usage comes from two places, because neither alone has everything:

* ``ptxas -v`` reports registers, static shared memory, the stack frame and spills per entry
  function (it stopped printing ``cmem`` in CUDA 13);
* the cubin itself (an ELF file) holds the kernel's constant bank 0 (parameters and driver
  area), the module's ``__constant__`` data and the ``__launch_bounds__`` maximum (in
  ``.nv.info.<kernel>``).

Failures keep the distinction the sampler learns from: a ptxas "uses too much shared data" or a
register-allocation failure is a *resource* failure (:attr:`CompileError.is_resource`, recorded as
``Status.RESOURCE``), while a syntax or type error is a plain *compile* failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "COMPILERS",
    "CompileError",
    "CompileRequest",
    "CompiledKernel",
    "KernelCompiler",
    "KernelResources",
    "NvccCompiler",
    "compile_kernel",
    "compile_many",
    "cubin_resources",
    "kernel_resources",
    "make_compiler",
    "nvcc_version",
    "parse_ptxas_report",
    "run_process_group",
    "usable_cpus",
]

#: the values of ``kernel.compiler``: ``auto`` is NVRTC where libnvrtc is found, else nvcc
COMPILERS = ("auto", "nvrtc", "nvcc")

#: bump when the cache layout or the meaning of a cached field changes
_CACHE_VERSION = 1
#: how much of a failing compiler log is kept in the error message
_MAX_MESSAGE_LINES = 40
_MAX_MESSAGE_CHARS = 4000


@dataclass(frozen=True)
class CompileRequest:
    """One kernel source to compile. ``options`` are extra nvcc flags from the experiment."""

    source: str
    kernel_name: str
    arch: str = "sm_90"
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a list from a TOML file would make the frozen request unhashable; normalise it once
        object.__setattr__(self, "options", tuple(str(o) for o in self.options))

    def cache_key(self, compiler_version: str) -> str:
        """The cache key given the compiler's ``--version`` text (see :attr:`key`)."""
        payload = json.dumps(
            [
                _CACHE_VERSION,
                self.source,
                self.kernel_name,
                self.arch,
                list(self.options),
                compiler_version,
            ]
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    @property
    def key(self) -> str:
        """sha256 over everything that decides the cubin, including the ``nvcc`` on PATH.

        The compiler version is part of it because a new ptxas allocates registers differently,
        and a stale cubin would silently misreport the resource usage.
        """
        return self.cache_key(nvcc_version())


@dataclass(frozen=True)
class KernelResources:
    """Per-kernel resource usage, as the compiler allocated it.

    ``local_bytes`` is the per-thread local memory, i.e. the stack frame: ptxas places spilled
    registers inside the stack frame, so the spill counts (bytes moved by spill instructions, not
    space) are reported separately rather than added to it.
    """

    registers: int
    shared_static_bytes: int
    local_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    constant_bytes: int
    barriers: int = 0
    max_threads_per_block: int | None = None


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled cubin with its resource report; ``cached`` when it came from the disk cache.

    ``kernel_name`` is the symbol to look up in the cubin: the requested name for an
    ``extern "C"`` kernel, the mangled name NVRTC lowered it to otherwise.
    """

    cubin: bytes
    kernel_name: str
    resources: KernelResources
    compile_time_ms: float
    log: str
    cached: bool = False


class CompileError(Exception):
    """nvcc refused the source, ran out of time, or did not produce the requested kernel.

    ``message`` holds the useful lines of the compiler log. ``is_resource`` is true when the
    source is valid but needs more than the architecture gives (too much shared memory, register
    allocation failure): the backend records those as ``Status.RESOURCE``, the rest as
    ``Status.COMPILE`` (or ``Status.TIMEOUT`` when ``timed_out``).
    """

    def __init__(
        self,
        message: str,
        *,
        compile_time_ms: float = 0.0,
        timed_out: bool = False,
        is_resource: bool = False,
        log: str = "",
        cached: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.compile_time_ms = compile_time_ms
        self.timed_out = timed_out
        self.is_resource = is_resource
        self.log = log
        self.cached = cached

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only arguments do not survive the default Exception pickling (process pools)
        return (_rebuild_error, (self.message, self._fields()))

    def _fields(self) -> dict[str, Any]:
        return {
            "compile_time_ms": self.compile_time_ms,
            "timed_out": self.timed_out,
            "is_resource": self.is_resource,
            "log": self.log,
            "cached": self.cached,
        }

    def __str__(self) -> str:
        return self.message


def _rebuild_error(message: str, fields: dict[str, Any]) -> CompileError:
    return CompileError(message, **fields)


# --- the ptxas report ------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_USED = re.compile(r"Used (\d+) registers(?P<rest>[^\n]*)")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_CMEM0 = re.compile(r"(\d+) bytes cmem\[0\]")
_RESOURCE = re.compile(
    r"too much (shared|local|parameter|constant)? ?(data|space|memory)|too many resources"
    r"|register allocation|insufficient registers|out of registers|parameter space overflowed",
    re.IGNORECASE,
)


def _properties(log: str, kernel_name: str) -> tuple[int, int, int]:
    # nvcc indents the line; NVRTC prefixes it with "ptxas         ."
    match = re.search(
        rf"Function properties for {re.escape(kernel_name)}\s*\n(?:ptxas\s+\.)?\s*(\d+) bytes "
        r"stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
        log,
    )
    return (int(match[1]), int(match[2]), int(match[3])) if match else (0, 0, 0)


def parse_ptxas_report(log: str, kernel_name: str) -> KernelResources | None:
    """The resources ptxas reported for the entry function ``kernel_name``; None if absent.

    Only the block that follows "Compiling entry function '<name>'" is read, so other kernels
    in the same file do not leak into the report. ``constant_bytes`` is ptxas' ``cmem[0]`` where
    it still prints one (before CUDA 13), else 0: :func:`compile_kernel` fills it from the cubin.
    """
    entries = list(_ENTRY.finditer(log))
    for index, entry in enumerate(entries):
        if entry[1] != kernel_name:
            continue
        end = entries[index + 1].start() if index + 1 < len(entries) else len(log)
        block = log[entry.end() : end]
        used = _USED.search(block)
        if used is None:
            return None
        rest = used["rest"]
        smem = _SMEM.search(rest)
        barriers = _BARRIERS.search(rest)
        cmem = _CMEM0.search(rest)
        stack, spill_stores, spill_loads = _properties(log, kernel_name)
        return KernelResources(
            registers=int(used[1]),
            shared_static_bytes=int(smem[1]) if smem else 0,
            local_bytes=stack,
            stack_frame_bytes=stack,
            spill_store_bytes=spill_stores,
            spill_load_bytes=spill_loads,
            constant_bytes=int(cmem[1]) if cmem else 0,
            barriers=int(barriers[1]) if barriers else 0,
        )
    return None


def _useful_lines(log: str) -> str:
    """The compiler log without the ptxas info chatter, capped, for an error message."""
    kept = [
        line.rstrip()
        for line in log.splitlines()
        if line.strip()
        and not line.startswith("ptxas info")
        and not re.match(r"(ptxas\s+\.)?\s+\d+ bytes stack frame", line)
    ]
    if not kept:
        kept = [line.rstrip() for line in log.splitlines() if line.strip()][-_MAX_MESSAGE_LINES:]
    text = "\n".join(kept[:_MAX_MESSAGE_LINES])
    if len(kept) > _MAX_MESSAGE_LINES:
        text += f"\n... ({len(kept) - _MAX_MESSAGE_LINES} more lines)"
    return text[:_MAX_MESSAGE_CHARS] or "(the compiler printed nothing)"


# --- the cubin -------------------------------------------------------------------------------

_EIATTR_MAX_THREADS = 0x05  # __launch_bounds__ maximum, three u32 (x, y, z)
_EIFMT_SVAL = 0x04  # attribute with a u16 size and a payload; the other formats are 4 bytes


def _nv_info(cubin: bytes, section: tuple[int, int, int]) -> Iterator[tuple[int, int, int]]:
    """(attribute, payload offset, payload length) of each sized entry of a ``.nv.info``
    section; the other entry formats are 4 bytes with no payload and are skipped."""
    offset, size, _ = section
    pos, end = offset, offset + size
    while pos + 4 <= end:
        fmt, attr = cubin[pos], cubin[pos + 1]
        if fmt != _EIFMT_SVAL:
            pos += 4
            continue
        (length,) = struct.unpack_from("<H", cubin, pos + 2)
        yield attr, pos + 4, length
        pos += 4 + length


def _kernel_info(
    cubin: bytes, sections: Mapping[str, tuple[int, int, int]], kernel_name: str
) -> tuple[int, int | None]:
    """(constant bytes, max threads per block from __launch_bounds__) of a parsed cubin."""
    constant = 0
    for name, (_offset, size, _info) in sections.items():
        if name == f".nv.constant0.{kernel_name}" or re.fullmatch(r"\.nv\.constant[1-9]\d*", name):
            constant += size
    max_threads = None
    info = sections.get(f".nv.info.{kernel_name}", (0, 0, 0))
    for attr, payload, length in _nv_info(cubin, info):
        if attr == _EIATTR_MAX_THREADS and length >= 12:
            x, y, z = struct.unpack_from("<III", cubin, payload)
            max_threads = x * y * z
    return constant, max_threads


def _cubin_kernel_info(cubin: bytes, kernel_name: str) -> tuple[int | None, int | None]:
    """(constant bytes, max threads per block from __launch_bounds__) read from the cubin."""
    sections = _section_headers(cubin)
    if not sections:
        return None, None
    return _kernel_info(cubin, sections, kernel_name)


_EIATTR_FRAME_SIZE = 0x11  # in .nv.info: (symbol index, per-thread stack frame bytes)
_EIATTR_REGCOUNT = 0x2F  # in .nv.info: (symbol index, registers per thread)
_RESERVED_SHARED_BYTES = 1024  # per block, sm_90 and later, counted in the cubin's shared section


def _section_headers(cubin: bytes) -> dict[str, tuple[int, int, int]]:
    """Section name -> (offset, size, sh_info) of a little-endian ELF64 cubin; {} otherwise."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return {}
    try:
        (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        headers = [
            struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize) for i in range(shnum)
        ]
        strtab = headers[shstrndx][4]
        out: dict[str, tuple[int, int, int]] = {}
        for name_offset, _type, _flags, _addr, offset, size, _link, info in headers:
            start = strtab + name_offset
            name = cubin[start : cubin.index(b"\0", start)].decode("ascii", "replace")
            out[name] = (offset, size, info)
        return out
    except (struct.error, IndexError, ValueError):
        return {}


def _symbol_attributes(cubin: bytes, section: tuple[int, int, int]) -> dict[int, dict[int, int]]:
    """attribute -> {symbol index: value} for the (symbol, u32) attributes of a .nv.info."""
    found: dict[int, dict[int, int]] = {}
    for attr, payload, length in _nv_info(cubin, section):
        if length == 8 and attr in (_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT):
            symbol, value = struct.unpack_from("<II", cubin, payload)
            found.setdefault(attr, {})[symbol] = value
    return found


def cubin_resources(cubin: bytes, kernel_name: str) -> KernelResources | None:
    """The kernel's resources read from the cubin itself, for when no ptxas report is at hand.

    Registers are in the ``.text.<kernel>`` section header (``sh_info >> 24``, the low 24 bits
    being the kernel's symbol index, which the ``EIATTR_REGCOUNT`` attribute repeats), static
    shared memory is the size of ``.nv.shared.<kernel>``, and the per-thread stack frame (where
    spills live) is ``EIATTR_FRAME_SIZE``. Spill *traffic* is only in ptxas' report: 0 here.
    From sm_90 on, a kernel's shared section also holds the 1 KB the system reserves per block
    (a ``.nv.shared.reserved.0`` section marks it; checked with nvcc 13 for sm_75 to sm_120), which
    ptxas and ``cudaFuncAttributes.sharedSizeBytes`` leave out: so is it here.
    None when the cubin has no such kernel or no register count for it.
    """
    sections = _section_headers(cubin)
    text = sections.get(f".text.{kernel_name}")
    if text is None or ".nv.info" not in sections:
        return None
    symbol = text[2] & 0xFFFFFF
    attributes = _symbol_attributes(cubin, sections[".nv.info"])
    registers = attributes.get(_EIATTR_REGCOUNT, {}).get(symbol)
    if registers is None:
        return None
    frame = attributes.get(_EIATTR_FRAME_SIZE, {}).get(symbol, 0)
    shared = sections.get(f".nv.shared.{kernel_name}", (0, 0, 0))[1]
    if ".nv.shared.reserved.0" in sections and shared >= _RESERVED_SHARED_BYTES:
        shared -= _RESERVED_SHARED_BYTES
    constant, max_threads = _kernel_info(cubin, sections, kernel_name)
    return KernelResources(
        registers=registers,
        shared_static_bytes=shared,
        local_bytes=frame,
        stack_frame_bytes=frame,
        spill_store_bytes=0,
        spill_load_bytes=0,
        constant_bytes=constant,
        max_threads_per_block=max_threads,
    )


def kernel_resources(log: str, cubin: bytes, kernel_name: str) -> KernelResources | None:
    """The kernel's resources: ptxas' report in ``log`` completed from the cubin (constant
    bytes, ``__launch_bounds__``), or, where the log has no report for the kernel, the cubin
    alone (:func:`cubin_resources`); None when neither knows the kernel."""
    reported = parse_ptxas_report(log, kernel_name)
    if reported is None:
        return cubin_resources(cubin, kernel_name)
    constant, max_threads = _cubin_kernel_info(cubin, kernel_name)
    return dataclasses.replace(
        reported,
        constant_bytes=reported.constant_bytes if constant is None else constant,
        max_threads_per_block=max_threads,
    )


# --- running nvcc ----------------------------------------------------------------------------


def _nvcc_missing(nvcc: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"the CUDA compiler {nvcc!r} was not found; install the CUDA toolkit or pass nvcc=<path>"
    )


def nvcc_version(nvcc: str = "nvcc") -> str:
    """The full ``nvcc --version`` text (release and build), part of every cache key."""
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise _nvcc_missing(nvcc) from exc
    if done.returncode != 0:
        raise FileNotFoundError(f"{nvcc!r} --version failed: {done.stderr.strip()}")
    return done.stdout.strip()


def run_process_group(
    command: Sequence[str], timeout_s: float, *, cwd: str | None = None
) -> tuple[int | None, str]:
    """Run ``command`` in its own process group and return its exit code (None on timeout) and
    its combined output; on timeout the whole group is killed.

    Killing only the leader (nvcc, compute-sanitizer) would leave its children (cicc and ptxas,
    the sanitized Python) holding the pipes, and the wait would hang. Raises FileNotFoundError
    when the executable does not exist.
    """
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output or ""
    return process.returncode, output or ""


def _run(command: list[str], cwd: str, timeout_s: float) -> tuple[int | None, str]:
    """Run nvcc (see :func:`run_process_group`); a missing nvcc is not a compile error."""
    try:
        return run_process_group(command, timeout_s, cwd=cwd)
    except FileNotFoundError as exc:
        raise _nvcc_missing(command[0]) from exc


def _read_cache(directory: Path, key: str, kernel_name: str) -> CompiledKernel | None:
    meta_path = directory / f"{key}.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("version") != _CACHE_VERSION or meta.get("kernel_name") != kernel_name:
            return None
        if not meta["ok"]:
            raise CompileError(
                meta["message"],
                compile_time_ms=meta["compile_time_ms"],
                is_resource=meta["is_resource"],
                log=meta["log"],
                cached=True,
            )
        cubin = (directory / f"{key}.cubin").read_bytes()
        return CompiledKernel(
            cubin=cubin,
            kernel_name=meta.get("symbol", kernel_name),
            resources=KernelResources(**meta["resources"]),
            compile_time_ms=meta["compile_time_ms"],
            log=meta["log"],
            cached=True,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged entry is a miss; the compile below overwrites it


def _write_atomically(path: Path, data: bytes) -> None:
    """Write via a rename so that runners sharing a cache never read half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_cache(
    directory: Path, key: str, kernel_name: str, outcome: CompiledKernel | CompileError
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "version": _CACHE_VERSION,
        "kernel_name": kernel_name,
        "compile_time_ms": outcome.compile_time_ms,
    }
    if isinstance(outcome, CompiledKernel):
        _write_atomically(directory / f"{key}.cubin", outcome.cubin)
        meta |= {
            "ok": True,
            "symbol": outcome.kernel_name,  # NVRTC's lowered name of a C++ kernel
            "resources": dataclasses.asdict(outcome.resources),
            "log": outcome.log,
        }
    else:
        meta |= {
            "ok": False,
            "message": outcome.message,
            "is_resource": outcome.is_resource,
            "log": outcome.log,
        }
    _write_atomically(directory / f"{key}.json", json.dumps(meta).encode("utf-8"))


def _compile_uncached(
    request: CompileRequest, nvcc: str, timeout_s: float
) -> tuple[CompiledKernel | CompileError, bool]:
    """Compile once; the flag says whether the outcome is deterministic, hence cacheable."""
    with tempfile.TemporaryDirectory(prefix="surrotune-nvcc-") as workdir:
        source = Path(workdir, "kernel.cu")
        source.write_text(request.source, encoding="utf-8")
        command = [
            nvcc,
            "-cubin",
            f"-arch={request.arch}",
            "-Xptxas",
            "-v",
            *request.options,
            "-o",
            "kernel.cubin",
            source.name,
        ]
        started = time.perf_counter()
        returncode, log = _run(command, workdir, timeout_s)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if returncode is None:
            message = f"nvcc did not finish within {timeout_s:g} s"
            return CompileError(
                message, compile_time_ms=elapsed_ms, timed_out=True, log=log
            ), False
        if returncode != 0:
            error = CompileError(
                _useful_lines(log),
                compile_time_ms=elapsed_ms,
                is_resource=bool(_RESOURCE.search(log)),
                log=log,
            )
            # a positive exit code is the compiler's verdict; a signal (OOM kill) is not
            return error, returncode > 0
        cubin = Path(workdir, "kernel.cubin").read_bytes()
    resources = kernel_resources(log, cubin, request.kernel_name)
    if resources is None:
        compiled = sorted({m[1] for m in _ENTRY.finditer(log)})
        message = (
            f"the compiled source has no entry function {request.kernel_name!r} "
            f'(it has: {", ".join(compiled) or "none"}); declare it extern "C" __global__'
        )
        return CompileError(message, compile_time_ms=elapsed_ms, log=log), True
    kernel = CompiledKernel(
        cubin=cubin,
        kernel_name=request.kernel_name,
        resources=resources,
        compile_time_ms=elapsed_ms,
        log=log,
    )
    return kernel, True


def compile_kernel(
    request: CompileRequest,
    *,
    nvcc: str = "nvcc",
    cache_dir: Path | None = None,
    timeout_s: float = 120.0,
) -> CompiledKernel:
    """Compile ``request`` to a cubin with ``nvcc -cubin -Xptxas -v`` and read its resources.

    With ``cache_dir``, outcomes are stored under ``request``'s key: a hit returns the stored
    kernel with ``cached=True`` and the original ``compile_time_ms``, and a deterministic failure
    is raised again from the cache. Timeouts are never cached.

    Raises:
        CompileError: the source does not compile, exceeds a resource limit (``is_resource``),
            lacks the kernel, or nvcc ran past ``timeout_s`` (``timed_out``).
        FileNotFoundError: ``nvcc`` is not installed; that is not a property of the kernel.
    """
    key = request.cache_key(nvcc_version(nvcc)) if cache_dir is not None else ""
    if cache_dir is not None:
        hit = _read_cache(Path(cache_dir), key, request.kernel_name)
        if hit is not None:
            return hit
    outcome, cacheable = _compile_uncached(request, nvcc, timeout_s)
    if cache_dir is not None and cacheable:
        _write_cache(Path(cache_dir), key, request.kernel_name, outcome)
    if isinstance(outcome, CompileError):
        raise outcome
    return outcome


def compile_many(
    requests: Sequence[CompileRequest], *, workers: int | None = None, **kwargs: Any
) -> list[CompiledKernel | CompileError]:
    """Compile ``requests`` in parallel; one kernel or CompileError per request, in order.

    ``kwargs`` go to :func:`compile_kernel`. Errors that are not about a kernel (nvcc missing)
    propagate instead of being repeated once per request.
    """

    def one(request: CompileRequest) -> CompiledKernel | CompileError:
        try:
            return compile_kernel(request, **kwargs)
        except CompileError as error:
            return error

    if not requests:
        return []
    count = max(1, min(workers or os.cpu_count() or 1, len(requests)))
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="nvcc") as pool:
        return list(pool.map(one, requests))


# --- compilers behind one interface ------------------------------------------------------------


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity, which a container or ``taskset``
    narrows), which is what a compile pool should fill; ``os.cpu_count()`` counts the host's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


@runtime_checkable
class KernelCompiler(Protocol):
    """Compiles requests in the background: ``submit`` returns at once with a future.

    The future's result is the kernel or its :class:`CompileError` (a failing configuration is a
    result, not an exception); it raises only for what no configuration could fix (the compiler
    is missing or refuses the options). ``name`` and ``version`` identify the compiler.
    """

    name: str

    @property
    def version(self) -> str: ...

    def submit(self, request: CompileRequest) -> Future[CompiledKernel | CompileError]: ...

    def close(self) -> None: ...


class NvccCompiler:
    """nvcc behind :class:`KernelCompiler`: each request is one nvcc run on a thread.

    Args:
        nvcc: the compiler executable.
        cache_dir: where outcomes are cached (None: no cache).
        timeout_s: how long one nvcc run may take (``timeout``).
        workers: concurrent nvcc runs (None: one per CPU core this process may use).
    """

    name = "nvcc"

    def __init__(
        self,
        *,
        nvcc: str = "nvcc",
        cache_dir: Path | None = None,
        timeout_s: float = 120.0,
        workers: int | None = None,
    ) -> None:
        self.nvcc = nvcc
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self.workers = max(1, workers or usable_cpus())
        self._pool: ThreadPoolExecutor | None = None
        self._version: str | None = None

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = nvcc_version(self.nvcc)
        return self._version

    def submit(self, request: CompileRequest) -> Future[CompiledKernel | CompileError]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="nvcc")
        return self._pool.submit(self._compile, request)

    def _compile(self, request: CompileRequest) -> CompiledKernel | CompileError:
        try:
            return compile_kernel(
                request, nvcc=self.nvcc, cache_dir=self.cache_dir, timeout_s=self.timeout_s
            )
        except CompileError as error:
            return error

    def close(self) -> None:
        """Drop queued requests; runs in progress end by themselves (within ``timeout_s``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> NvccCompiler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_compiler(
    name: str,
    *,
    cache_dir: Path | None = None,
    timeout_s: float = 120.0,
    workers: int | None = None,
    nvcc: str = "nvcc",
) -> KernelCompiler:
    """The compiler ``kernel.compiler`` names; see :data:`COMPILERS`.

    ``auto`` prefers NVRTC because it is what makes compilation keep up with the GPU (about a
    third of nvcc's time per kernel, and no process per compile); it falls back to nvcc only
    where no libnvrtc is found. Neither starts anything before the first ``submit``.

    Raises:
        surrotune.backends.nvrtc.NvrtcNotFound: ``nvrtc`` was asked for and is not installed.
        ValueError: ``name`` is not one of :data:`COMPILERS`.
    """
    if name not in COMPILERS:
        raise ValueError(f"unknown compiler {name!r}; expected one of {', '.join(COMPILERS)}")
    if name in ("auto", "nvrtc"):
        from surrotune.backends.nvrtc import NvrtcCompiler, NvrtcNotFound

        try:
            return NvrtcCompiler(cache_dir=cache_dir, timeout_s=timeout_s, workers=workers)
        except NvrtcNotFound:
            if name == "nvrtc":
                raise
    return NvccCompiler(nvcc=nvcc, cache_dir=cache_dir, timeout_s=timeout_s, workers=workers)
