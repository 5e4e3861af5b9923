"""NVRTC: finding the library, translating options, and compiling in the process pool.

The pure parts run everywhere; the compiles need libnvrtc (the CUDA toolkit or the
``nvidia-cuda-nvrtc`` wheel) and are skipped, with the reason, where it is missing. The last test
checks that NVRTC and nvcc report the same resources for the same GEMM configurations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    KernelCompiler,
    NvccCompiler,
    make_compiler,
    parse_ptxas_report,
)
from surrotune.backends.nvrtc import (
    NvrtcCompiler,
    NvrtcError,
    NvrtcLibrary,
    NvrtcNotFound,
    find_nvrtc,
    nvrtc_options,
)
from surrotune.template import Template

REPO = Path(__file__).resolve().parents[2]


def _nvrtc() -> str | None:
    try:
        return find_nvrtc()
    except NvrtcNotFound:
        return None


LIBRARY = _nvrtc()
needs_nvrtc = pytest.mark.skipif(
    LIBRARY is None,
    reason="NO NVRTC: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`",
)

KERNEL = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }'


# --------------------------------------------------------------------------- options


def test_nvcc_habits_are_translated() -> None:
    options = nvrtc_options(
        ["-O3", "-Xptxas", "-O2", "-D", "N=4", "-I", "inc", "-maxrregcount", "64", "-lineinfo"],
        "sm_90",
    )
    assert "-O3" not in options  # nvcc's host optimisation level: nothing for NVRTC to do
    assert options[:5] == [
        "--ptxas-options=-O2",
        "-DN=4",
        "-Iinc",
        "--maxrregcount=64",
        "-lineinfo",
    ]
    assert options[5:] == [
        "--gpu-architecture=sm_90",
        "--ptxas-options=-v",
        "--device-as-default-execution-space",
    ]
    assert nvrtc_options(["-Xptxas=-O1", "--use_fast_math"], "sm_80")[:2] == [
        "--ptxas-options=-O1",
        "--use_fast_math",
    ]


def test_the_nvrtc_report_is_parsed_like_nvcc_s() -> None:
    """NVRTC prefixes the stack-frame line with 'ptxas .' where nvcc indents it."""
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z1kPf\n"
        "ptxas         .     48 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem\n"
    )
    resources = parse_ptxas_report(log, "_Z1kPf")
    assert resources is not None
    assert (resources.registers, resources.shared_static_bytes) == (40, 1024)
    assert (resources.stack_frame_bytes, resources.spill_store_bytes) == (48, 8)
    assert resources.spill_load_bytes == 12 and resources.barriers == 1


# --------------------------------------------------------------------------- finding the library


def test_an_explicit_folder_or_file_is_used(tmp_path: Path) -> None:
    for name in (
        "libnvrtc-builtins.so.13.0",
        "libnvrtc.alt.so.13",
        "libnvrtc.so",
        "libnvrtc.so.13",
    ):
        (tmp_path / name).write_bytes(b"")
    assert find_nvrtc(tmp_path) == str(tmp_path / "libnvrtc.so.13")  # versioned, not builtins
    assert find_nvrtc(tmp_path / "libnvrtc.so") == str(tmp_path / "libnvrtc.so")
    with pytest.raises(NvrtcNotFound, match="no NVRTC library"):
        find_nvrtc(tmp_path / "elsewhere")


def test_cuda_home_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "toolkit" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.12").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    assert find_nvrtc() == str(lib / "libnvrtc.so.12")


def test_a_missing_library_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import surrotune.backends.nvrtc as nvrtc

    monkeypatch.setattr(nvrtc, "_toolkit_dirs", lambda: iter(()))
    monkeypatch.setattr(nvrtc, "_wheel_dirs", lambda: iter(()))
    monkeypatch.setattr(nvrtc.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(NvrtcNotFound, match="pip install nvidia-cuda-nvrtc") as caught:
        find_nvrtc()
    assert 'compiler = "nvcc"' in str(caught.value)
    assert isinstance(caught.value, FileNotFoundError)  # what a missing nvcc raises, too
    with pytest.raises(NvrtcNotFound):
        make_compiler("nvrtc")
    fallback = make_compiler("auto")  # nvcc where NVRTC is missing
    assert isinstance(fallback, NvccCompiler) and isinstance(fallback, KernelCompiler)
    with pytest.raises(ValueError, match="auto, nvrtc, nvcc"):
        make_compiler("clang")


def test_a_file_that_is_no_library_is_refused_at_the_first_compile(tmp_path: Path) -> None:
    fake = tmp_path / "libnvrtc.so.13"
    fake.write_bytes(b"not a shared object")
    with NvrtcCompiler(library=fake, workers=1) as compiler:  # finding it is not loading it
        with pytest.raises(NvrtcNotFound, match="cannot load NVRTC"):
            compiler.submit(CompileRequest(KERNEL, "scale", "sm_90"))
        assert compiler.started_processes == 0


# --------------------------------------------------------------------------- compiling


@pytest.fixture(scope="module")
def nvrtc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvrtcCompiler]:
    cache = tmp_path_factory.mktemp("kernels")
    with NvrtcCompiler(cache_dir=cache, workers=2) as compiler:
        yield compiler


def compile_one(compiler: KernelCompiler, source: str, name: str, **kw: object) -> object:
    return compiler.submit(CompileRequest(source, name, **kw)).result(timeout=120)  # type: ignore[arg-type]


@needs_nvrtc
def test_the_library_reports_its_version() -> None:
    assert LIBRARY is not None
    library = NvrtcLibrary(LIBRARY)
    major, _minor = library.version
    assert major >= 11
    assert library.version_text.startswith(f"nvrtc {major}.")


@needs_nvrtc
def test_an_extern_c_kernel(nvrtc: NvrtcCompiler) -> None:
    kernel = compile_one(nvrtc, KERNEL, "scale", arch="sm_90")
    assert isinstance(kernel, CompiledKernel), kernel
    assert kernel.kernel_name == "scale" and kernel.cubin.startswith(b"\x7fELF")
    assert kernel.resources.registers > 0 and kernel.resources.constant_bytes > 0
    assert kernel.compile_time_ms > 0 and "Compiling entry function 'scale'" in kernel.log


@needs_nvrtc
def test_a_cxx_kernel_is_found_by_its_lowered_name(nvrtc: NvrtcCompiler) -> None:
    source = "template <int N> __global__ void __launch_bounds__(256) k(float* x) { x[0] = N; }"
    kernel = compile_one(nvrtc, source, "k<3>", arch="sm_90")
    assert isinstance(kernel, CompiledKernel), kernel
    assert kernel.kernel_name.startswith("_Z") and "k" in kernel.kernel_name
    assert kernel.resources.max_threads_per_block == 256


@needs_nvrtc
def test_failures_keep_their_kind(nvrtc: NvrtcCompiler) -> None:
    missing = compile_one(nvrtc, KERNEL, "absent", arch="sm_90")
    assert isinstance(missing, CompileError) and "no kernel 'absent'" in missing.message
    broken = compile_one(nvrtc, KERNEL.replace("*=", "*=="), "scale", arch="sm_90")
    assert isinstance(broken, CompileError) and not broken.is_resource
    assert "error" in broken.message and not broken.timed_out
    too_big = (
        'extern "C" __global__ void big(float* x) { __shared__ float s[20000];'
        " s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[threadIdx.x + 1]; }"
    )
    resource = compile_one(nvrtc, too_big, "big", arch="sm_90")
    assert isinstance(resource, CompileError) and resource.is_resource
    assert "too much shared data" in resource.message


@needs_nvrtc
def test_an_option_nvrtc_refuses_is_raised_not_recorded(nvrtc: NvrtcCompiler) -> None:
    future = nvrtc.submit(CompileRequest(KERNEL, "scale", "sm_90", ("--no-such-option",)))
    with pytest.raises(NvrtcError, match="no-such-option"):
        future.result(timeout=120)


@needs_nvrtc
def test_outcomes_come_back_from_the_disk_cache(nvrtc: NvrtcCompiler) -> None:
    source = "template <int N> __global__ void cached(float* x) { x[0] = N; }"
    request = CompileRequest(source, "cached<7>", "sm_90")
    first = nvrtc.submit(request).result(timeout=120)
    again = nvrtc.submit(request).result(timeout=0)  # answered at once, by the parent
    assert isinstance(first, CompiledKernel) and isinstance(again, CompiledKernel)
    assert not first.cached and again.cached
    assert again.cubin == first.cubin and again.kernel_name == first.kernel_name
    assert again.resources == first.resources
    error = CompileRequest(source.replace("N;", "N"), "cached<7>", "sm_90")
    assert not nvrtc.submit(error).result(timeout=120).cached  # type: ignore[union-attr]
    repeated = nvrtc.submit(error).result(timeout=0)
    assert isinstance(repeated, CompileError) and repeated.cached
    # nvcc's entries for the same request live under another key
    assert request.cache_key(nvrtc.version) != request.cache_key("nvcc 13.0")


@needs_nvrtc
def test_a_compile_past_its_deadline_costs_one_result(tmp_path: Path) -> None:
    gemm = Template.from_file(REPO / "templates" / "gemm.cu")
    env = {"M": 64, "N": 64, "K": 64, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TM": 8,
           "TN": 8, "VEC": 4, "PAD": 0, "UNROLL": 0, "DOUBLE_BUFFER": 1}  # fmt: skip
    with NvrtcCompiler(workers=1) as compiler:
        compiler.submit(CompileRequest(KERNEL, "scale", "sm_90")).result(timeout=120)  # warm
        started = compiler.started_processes
        compiler.timeout_s = 0.05  # read when a compile is handed to a process
        slow = compiler.submit(CompileRequest(gemm.render(env), "gemm", "sm_90"))
        outcome = slow.result(timeout=120)
        assert isinstance(outcome, CompileError) and outcome.timed_out
        assert "did not finish within 0.05 s" in outcome.message
        compiler.timeout_s = 120.0
        after = compiler.submit(CompileRequest(KERNEL, "scale", "sm_80")).result(timeout=120)
        assert isinstance(after, CompiledKernel)  # a fresh process took over
        assert compiler.started_processes == started + 1


@needs_nvrtc
def test_the_pool_uses_every_worker(tmp_path: Path) -> None:
    sources = [KERNEL.replace("a;", f"a + {i}.0f;") for i in range(6)]
    with NvrtcCompiler(workers=2) as compiler:
        futures = [compiler.submit(CompileRequest(s, "scale", "sm_90")) for s in sources]
        outcomes = [f.result(timeout=120) for f in futures]
        assert all(isinstance(o, CompiledKernel) for o in outcomes)
        assert len({o.cubin for o in outcomes if isinstance(o, CompiledKernel)}) == 6
        assert compiler.started_processes == 2  # two processes, each compiled three
    compiler.close()  # a second close is harmless
    with pytest.raises(RuntimeError, match="closed"):
        compiler.submit(CompileRequest(KERNEL, "scale", "sm_90"))


# --------------------------------------------------------------------------- the same as nvcc


def _release(text: str) -> str | None:
    match = re.search(r"release (\d+\.\d+)", text)
    return match[1] if match else None


GEMM_CONFIGS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 8, "TM": 4, "TN": 4, "VEC": 4, "PAD": 0,
     "UNROLL": 0, "DOUBLE_BUFFER": 0},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 8, "TM": 8, "TN": 4, "VEC": 2, "PAD": 1,
     "UNROLL": 1, "DOUBLE_BUFFER": 1},
]  # fmt: skip


@needs_nvrtc
@pytest.mark.nvcc
def test_nvrtc_and_nvcc_agree_on_gemm_resources(nvrtc: NvrtcCompiler) -> None:
    nvcc_release = _release(subprocess.run(["nvcc", "--version"], capture_output=True,
                                            text=True, check=False).stdout)  # fmt: skip
    assert LIBRARY is not None and shutil.which("nvcc")
    major, minor = NvrtcLibrary(LIBRARY).version
    if nvcc_release != f"{major}.{minor}":
        pytest.skip(f"nvcc {nvcc_release} and NVRTC {major}.{minor} have different ptxas")
    gemm = Template.from_file(REPO / "templates" / "gemm.cu")
    sizes = {"M": 2048, "N": 2048, "K": 2048}
    requests = [
        CompileRequest(gemm.render({**sizes, **config}), "gemm", "sm_90", ("-O3",))
        for config in GEMM_CONFIGS
    ]
    with NvccCompiler(workers=2) as nvcc:
        by_nvcc = [f.result(timeout=300) for f in [nvcc.submit(r) for r in requests]]
    by_nvrtc = [f.result(timeout=300) for f in [nvrtc.submit(r) for r in requests]]
    for ours, theirs in zip(by_nvrtc, by_nvcc, strict=True):
        assert isinstance(ours, CompiledKernel) and isinstance(theirs, CompiledKernel)
        a, b = ours.resources, theirs.resources
        assert (a.registers, a.shared_static_bytes, a.barriers) == (
            b.registers,
            b.shared_static_bytes,
            b.barriers,
        )
        assert (a.local_bytes, a.spill_store_bytes, a.spill_load_bytes) == (
            b.local_bytes,
            b.spill_store_bytes,
            b.spill_load_bytes,
        )
        assert a.max_threads_per_block == b.max_threads_per_block
        # NVRTC's cubin also holds the namespace-scope constants as device data, so its constant
        # banks are somewhat larger; the parameter bank they share is the same
        assert a.constant_bytes >= b.constant_bytes


@needs_nvrtc
def test_warm_up_starts_every_process_before_the_first_request() -> None:
    """The pool's start overlaps the GPU worker's: after warm_up, all children get ready with
    nothing submitted, and the first requests find them ready (no new process is started)."""
    with NvrtcCompiler(workers=2) as compiler:
        compiler.warm_up()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            children = list(compiler._children)
            if len(children) == 2 and all(child.ready for child in children):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the warmed-up pool did not get ready within 60 s")
        assert compiler.started_processes == 2
        sources = [KERNEL.replace("a;", f"a + {i}.5f;") for i in range(3)]
        futures = [compiler.submit(CompileRequest(s, "scale", "sm_90")) for s in sources]
        assert all(isinstance(f.result(timeout=120), CompiledKernel) for f in futures)
        assert compiler.started_processes == 2


@needs_nvrtc
def test_a_process_that_exits_with_its_compiler_warming_up_starts_no_orphan_child() -> None:
    """Exiting while the dispatcher starts children (a compiler never closed) must not leave a
    child that dies reading its start-up data: seen after pytest's summary, once a run."""
    import sys

    script = (
        "import time\n"
        "from surrotune.backends.nvrtc import NvrtcCompiler\n"
        "compiler = NvrtcCompiler(workers=2)\n"
        "compiler.warm_up()\n"
        "time.sleep(0.05)\n"
    )
    for _ in range(4):  # a race: without the fix two runs in three showed it
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "EOFError" not in done.stderr, done.stderr
