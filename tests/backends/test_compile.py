"""nvcc compilation: resource reports, the compile/resource failure split, the cache, batches."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    KernelResources,
    compile_kernel,
    compile_many,
    cubin_resources,
    nvcc_version,
    parse_ptxas_report,
)

#: real `nvcc -cubin -arch=sm_90 -Xptxas -v -maxrregcount=32` output, CUDA 13.0 (V13.0.88)
PTXAS_SM90_CUDA13 = """\
ptxas info    : Overriding maximum register limit 256 for 'spill' with  32 of maxrregcount option
ptxas info    : Overriding global maxrregcount 32 with entry-specific value 128 computed using \
thread count
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_90'
ptxas info    : Function properties for spill
    304 bytes stack frame, 304 bytes spill stores, 416 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 304 bytes cumulative stack size
ptxas info    : Compile time = 98.064 ms
ptxas info    : Compiling entry function 'add' for 'sm_90'
ptxas info    : Function properties for add
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 8.587 ms
"""

#: real output for a file whose kernel 'big' needs 64 KB of static shared memory (CUDA 13.0)
PTXAS_TOO_MUCH_SHARED = """\
ptxas error   : Entry function 'big' uses too much shared data (0x10040 bytes, 0xc000 max)
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 65600 bytes smem
ptxas info    : Compile time = 4.320 ms
ptxas info    : Compiling entry function 'spill' for 'sm_90'
ptxas info    : Function properties for spill
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 0 barriers
ptxas info    : Compile time = 32.883 ms
"""

TRIVIAL = """\
__constant__ float scale[64];
extern "C" __global__ void __launch_bounds__(256) add(const float* a, float* b, int n) {
  __shared__ float s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? a[i] : 0.0f;
  __syncthreads();
  if (i < n) b[i] = s[255 - threadIdx.x] * scale[threadIdx.x & 63];
}
extern "C" __global__ void copy(const float* a, float* b) { b[threadIdx.x] = a[threadIdx.x]; }
"""

SYNTAX_ERROR = """\
extern "C" __global__ void broken(float* b) { b[0] = undefined_thing; }
"""

TOO_MUCH_SHARED = """\
extern "C" __global__ void big(float* b) {
  __shared__ float s[16384 + 16];  // 64 KB + 64 B: over sm_90's 48 KB static limit
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  b[threadIdx.x] = s[threadIdx.x + 5];
}
"""

SPILLS = """\
extern "C" __global__ void spill(const float* a, float* b, int n, int k) {
  float local[64];
  for (int j = 0; j < 64; ++j) local[j] = a[j * n + threadIdx.x];
  b[threadIdx.x] = local[k & 63] + local[(k * 7) & 63];
}
"""


# --- parsing, no compiler needed -----------------------------------------------------------


def test_parse_reads_the_requested_kernel_only() -> None:
    spill = parse_ptxas_report(PTXAS_SM90_CUDA13, "spill")
    add = parse_ptxas_report(PTXAS_SM90_CUDA13, "add")
    assert spill == KernelResources(
        registers=32,
        shared_static_bytes=0,
        local_bytes=304,
        stack_frame_bytes=304,
        spill_store_bytes=304,
        spill_load_bytes=416,
        constant_bytes=0,
        barriers=0,
    )
    assert add is not None
    assert (add.registers, add.shared_static_bytes, add.local_bytes, add.barriers) == (
        10,
        1024,
        0,
        1,
    )


def test_parse_without_smem_field_and_after_an_error_line() -> None:
    big = parse_ptxas_report(PTXAS_TOO_MUCH_SHARED, "big")
    spill = parse_ptxas_report(PTXAS_TOO_MUCH_SHARED, "spill")
    assert big is not None and big.shared_static_bytes == 65600
    assert spill is not None and (spill.registers, spill.shared_static_bytes) == (72, 0)


def test_parse_unknown_kernel_is_none() -> None:
    assert parse_ptxas_report(PTXAS_SM90_CUDA13, "sp") is None
    assert parse_ptxas_report("", "add") is None


def test_parse_reads_cmem_where_older_ptxas_prints_it() -> None:
    # the CUDA 12 line format, which still reported constant bank 0
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 4096 bytes smem, 372 bytes cmem[0]\n"
    )
    resources = parse_ptxas_report(log, "k")
    assert resources is not None
    assert (resources.registers, resources.shared_static_bytes) == (40, 4096)
    assert (resources.constant_bytes, resources.local_bytes) == (372, 8)


def test_request_normalises_options_and_keys_on_every_input() -> None:
    request = CompileRequest("src", "k", options=["-O3"])  # type: ignore[arg-type]
    assert request.options == ("-O3",)
    base = request.cache_key("nvcc 13.0")
    assert base == CompileRequest("src", "k", options=("-O3",)).cache_key("nvcc 13.0")
    variants = [
        CompileRequest("src2", "k", options=("-O3",)),
        CompileRequest("src", "k2", options=("-O3",)),
        CompileRequest("src", "k", arch="sm_80", options=("-O3",)),
        CompileRequest("src", "k", options=("-O3", "-DX=1")),
    ]
    keys = {base, request.cache_key("nvcc 12.4"), *(v.cache_key("nvcc 13.0") for v in variants)}
    assert len(keys) == 6


def test_compile_error_survives_pickling() -> None:
    error = CompileError("msg", compile_time_ms=5.0, is_resource=True, log="full log")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.message, copy.compile_time_ms, copy.is_resource, copy.timed_out) == (
        "msg",
        5.0,
        True,
        False,
    )
    assert copy.log == "full log"


def test_missing_nvcc_is_not_a_compile_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-nvcc")
    with pytest.raises(FileNotFoundError, match="no-nvcc"):
        compile_kernel(CompileRequest(TRIVIAL, "add"), nvcc=missing)
    with pytest.raises(FileNotFoundError):
        nvcc_version(missing)


# --- with nvcc -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trivial() -> CompiledKernel:
    return compile_kernel(CompileRequest(TRIVIAL, "add"))


@pytest.mark.nvcc
def test_trivial_kernel_resources(trivial: CompiledKernel) -> None:
    assert trivial.cubin[:4] == b"\x7fELF"
    assert trivial.kernel_name == "add"
    assert not trivial.cached
    assert trivial.compile_time_ms > 0
    assert "Compiling entry function 'add'" in trivial.log
    resources = trivial.resources
    assert 0 < resources.registers <= 255
    assert resources.shared_static_bytes == 256 * 4
    assert (resources.local_bytes, resources.spill_store_bytes, resources.spill_load_bytes) == (
        0,
        0,
        0,
    )
    assert resources.max_threads_per_block == 256
    # parameter bank (driver area + 20 bytes of arguments) plus the 256-byte __constant__ array
    assert resources.constant_bytes > 256 + 20


@pytest.mark.nvcc
def test_kernel_without_launch_bounds_has_no_thread_limit() -> None:
    copy = compile_kernel(CompileRequest(TRIVIAL, "copy"))
    assert copy.resources.max_threads_per_block is None
    assert copy.resources.shared_static_bytes == 0


@pytest.mark.nvcc
def test_syntax_error_is_a_compile_error_with_the_message() -> None:
    with pytest.raises(CompileError) as info:
        compile_kernel(CompileRequest(SYNTAX_ERROR, "broken"))
    error = info.value
    assert 'identifier "undefined_thing" is undefined' in error.message
    assert not error.is_resource
    assert not error.timed_out
    assert error.compile_time_ms > 0
    assert "undefined_thing" in error.log


@pytest.mark.nvcc
def test_too_much_shared_memory_is_a_resource_error() -> None:
    with pytest.raises(CompileError) as info:
        compile_kernel(CompileRequest(TOO_MUCH_SHARED, "big"))
    error = info.value
    assert error.is_resource
    assert "too much shared data" in error.message
    assert "ptxas info" not in error.message  # the chatter is trimmed, the error is kept


@pytest.mark.nvcc
def test_register_limit_forces_spills_into_local_memory() -> None:
    limited = compile_kernel(CompileRequest(SPILLS, "spill", options=("-maxrregcount=32",)))
    resources = limited.resources
    assert resources.registers <= 32
    assert resources.local_bytes > 0
    assert resources.local_bytes == resources.stack_frame_bytes
    assert resources.spill_store_bytes > 0 and resources.spill_load_bytes > 0


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
@pytest.mark.parametrize(
    ("source", "name", "options"),
    [(TRIVIAL, "add", ()), (TRIVIAL, "copy", ()), (SPILLS, "spill", ("-maxrregcount=32",))],
)
def test_the_cubin_alone_gives_the_resources_of_ptxas_report(
    arch: str, source: str, name: str, options: tuple[str, ...]
) -> None:
    """Where a compiler's log has no ptxas report (NVRTC on some installs), the cubin's own
    attributes give the same registers, static shared memory and stack frame."""
    compiled = compile_kernel(CompileRequest(source, name, arch=arch, options=options))
    reported = compiled.resources
    read = cubin_resources(compiled.cubin, name)
    assert read is not None
    assert (read.registers, read.shared_static_bytes, read.local_bytes) == (
        reported.registers,
        reported.shared_static_bytes,
        reported.local_bytes,
    )
    assert read.max_threads_per_block == reported.max_threads_per_block
    assert cubin_resources(compiled.cubin, name + "_missing") is None
    assert cubin_resources(b"not an ELF file", name) is None


@pytest.mark.nvcc
def test_unknown_kernel_name_lists_the_kernels() -> None:
    with pytest.raises(CompileError, match="add, copy") as info:
        compile_kernel(CompileRequest(TRIVIAL, "ad"))
    assert not info.value.is_resource


@pytest.mark.nvcc
def test_timeout_is_reported_and_not_cached(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as info:
        compile_kernel(CompileRequest(TRIVIAL, "add"), timeout_s=0.001, cache_dir=tmp_path)
    assert info.value.timed_out
    assert not info.value.is_resource
    assert list(tmp_path.iterdir()) == []


@pytest.mark.nvcc
def test_request_key_includes_the_installed_nvcc() -> None:
    request = CompileRequest(TRIVIAL, "add")
    assert "release" in nvcc_version()
    assert request.key == request.cache_key(nvcc_version())


@pytest.mark.nvcc
def test_cache_hit_returns_the_stored_kernel(tmp_path: Path) -> None:
    request = CompileRequest(TRIVIAL, "add", options=("-O3",))
    first = compile_kernel(request, cache_dir=tmp_path)
    second = compile_kernel(request, cache_dir=tmp_path)
    assert not first.cached
    assert second.cached
    assert second.cubin == first.cubin
    assert second.resources == first.resources
    assert second.compile_time_ms == first.compile_time_ms
    assert second.log == first.log
    assert (tmp_path / f"{request.key}.cubin").is_file()


@pytest.mark.nvcc
def test_cache_replays_deterministic_failures(tmp_path: Path) -> None:
    request = CompileRequest(TOO_MUCH_SHARED, "big")
    with pytest.raises(CompileError) as first:
        compile_kernel(request, cache_dir=tmp_path)
    with pytest.raises(CompileError) as second:
        compile_kernel(request, cache_dir=tmp_path)
    assert not first.value.cached and second.value.cached
    assert second.value.is_resource
    assert second.value.message == first.value.message
    assert second.value.compile_time_ms == first.value.compile_time_ms


@pytest.mark.nvcc
def test_damaged_cache_entry_is_a_miss(tmp_path: Path) -> None:
    request = CompileRequest(TRIVIAL, "copy")
    (tmp_path / f"{request.key}.json").write_text("{not json", encoding="utf-8")
    kernel = compile_kernel(request, cache_dir=tmp_path)
    assert not kernel.cached
    assert compile_kernel(request, cache_dir=tmp_path).cached


@pytest.mark.nvcc
def test_compile_many_keeps_order_and_returns_failures() -> None:
    requests = [
        CompileRequest(SYNTAX_ERROR, "broken"),
        CompileRequest(TRIVIAL, "copy"),
        CompileRequest(TOO_MUCH_SHARED, "big"),
        CompileRequest(TRIVIAL, "add"),
    ]
    results = compile_many(requests, workers=2)
    assert len(results) == 4
    assert isinstance(results[0], CompileError) and not results[0].is_resource
    assert isinstance(results[1], CompiledKernel) and results[1].kernel_name == "copy"
    assert isinstance(results[2], CompileError) and results[2].is_resource
    assert isinstance(results[3], CompiledKernel) and results[3].kernel_name == "add"


def test_compile_many_of_nothing() -> None:
    assert compile_many([]) == []
