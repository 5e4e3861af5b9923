"""The cuda backend: pure parts on the CPU, the whole pipeline with a fake GPU worker (needs
nvcc), and the real thing on a GPU (``gpu`` marker).

The test experiment is a vector add whose template has a MODE parameter that turns it into each
kind of failure: MODE 1 writes only half of the output, 2 writes through a wild pointer, 3 never
returns and 9 does not compile; SMEM_KB sets the dynamic shared memory (100 KB needs the opt-in
attribute, 300 KB is more than an H200 block may have).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from surrotune.backends.base import Backend, DescribesDevice
from surrotune.backends.compile import KernelResources
from surrotune.backends.cuda import (
    CudaBackend,
    check_limits,
    classify_cuda_error,
    launch_geometry,
)
from surrotune.backends.worker import (
    LaunchJob,
    LaunchReply,
    WorkerHandle,
    compute_expected,
    create_inputs,
    fill_array,
    poison,
    relative_l2_error,
    reset_output,
)
from surrotune.experiment import Experiment, LaunchSpec, load_experiment
from surrotune.expressions import Expression
from surrotune.result import Status

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
TEMPLATES = REPO / "templates"

#: H200 (sm_90) limits, as cudaGetDeviceProperties reports them
H200: dict[str, Any] = {
    "name": "NVIDIA H200",
    "major": 9,
    "minor": 0,
    "arch": "sm_90",
    "multiProcessorCount": 132,
    "maxThreadsPerBlock": 1024,
    "maxThreadsDim": [1024, 1024, 64],
    "maxGridSize": [2147483647, 65535, 65535],
    "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "maxThreadsPerMultiProcessor": 2048,
    "l2CacheSize": 52428800,
    "warpSize": 32,
    "totalGlobalMem": 150_000_000_000,
    "clockRate": 1980000,
    "memoryClockRate": 2619000,
    "device_id": 0,
}

TEMPLATE = """\
#define SMEM_BYTES (${SMEM_KB} * 1024)
static_assert(SMEM_BYTES >= 1024, "at least one kilobyte of dynamic shared memory");
#if ${MODE} == 9
#error "MODE 9 does not compile"
#endif

extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    extern __shared__ float buffer[];
    int i = blockIdx.x * ${BLOCK} + threadIdx.x;
#if ${MODE} == 1
    if (i < n / 2) c[i] = a[i] + b[i];  // writes only half of the output
#elif ${MODE} == 2
    if (i < n) ((float*)0x8)[i] = a[i];  // a wild pointer: illegal address
#elif ${MODE} == 3
    volatile float* out = c;
    while (true) { out[i % n] += 1.0f; }  // never returns
#else
    if (i < n) {
        buffer[threadIdx.x] = a[i];
        c[i] = buffer[threadIdx.x] + b[i];
    }
#endif
}
"""

REFERENCE = """\
import numpy as np


def vadd(a, b, c, n):
    assert isinstance(n, int) and n == a.size == c.size
    return {"c": a + b}
"""

EXPERIMENT = """\
[kernel]
template = "vadd.cu"
name = "vadd"

[sizes]
N = 10000

[[arguments]]
name = "a"
dtype = "float32"
shape = ["N"]

[[arguments]]
name = "b"
dtype = "float32"
shape = ["N"]

[[arguments]]
name = "c"
dtype = "float32"
shape = ["N"]
fill = "output"

[[arguments]]
name = "n"
dtype = "int32"
value = "N"

[launch]
grid = ["cdiv(N, BLOCK)"]
block = ["BLOCK"]
shared_memory = "SMEM_KB * 1024"

[parameters]
BLOCK = [32, 64, 128, 256, 2048]
MODE = [0, 1, 2, 3, 9]
SMEM_KB = [1, 100, 300]

[objective]
metric = "time"

[reference]
function = "ref.py:vadd"
rtol = 1e-6

[evaluation]
backend = "cuda"
warmup = 1
repeats = 3
kernel_timeout = 2
"""


def write_vadd(directory: Path) -> Experiment:
    """The vector-add experiment, written to ``directory`` and loaded like a user's."""
    (directory / "vadd.cu").write_text(TEMPLATE)
    (directory / "ref.py").write_text(REFERENCE)
    (directory / "vadd.toml").write_text(EXPERIMENT)
    return load_experiment(directory / "vadd.toml")


def config(block: int = 128, mode: int = 0, smem_kb: int = 1) -> dict[str, int]:
    return {"BLOCK": block, "MODE": mode, "SMEM_KB": smem_kb}


@pytest.fixture
def vadd(tmp_path: Path) -> Experiment:
    return write_vadd(tmp_path)


def resources(
    registers: int = 32, shared: int = 0, max_threads: int | None = None
) -> KernelResources:
    return KernelResources(
        registers=registers,
        shared_static_bytes=shared,
        local_bytes=0,
        stack_frame_bytes=0,
        spill_store_bytes=0,
        spill_load_bytes=0,
        constant_bytes=0,
        max_threads_per_block=max_threads,
    )


# --------------------------------------------------------------------------- limits


def test_a_launch_that_fits_passes() -> None:
    assert check_limits(resources(64), 1024, 48 * 1024, (1000, 1, 1), (1024, 1, 1), H200) is None
    big_shared = resources(shared=32 * 1024)
    assert check_limits(big_shared, 256, 195 * 1024, (10, 1, 1), (256, 1, 1), H200) is None


def test_too_many_threads_per_block() -> None:
    message = check_limits(resources(), 2048, 0, (1, 1, 1), (2048, 1, 1), H200)
    assert message is not None
    assert "2048" in message and "maxThreadsPerBlock" in message and "1024" in message


def test_launch_bounds_of_the_kernel() -> None:
    message = check_limits(resources(max_threads=256), 512, 0, (1, 1, 1), (512, 1, 1), H200)
    assert message is not None and "512" in message and "256" in message


def test_block_and_grid_dimensions() -> None:
    message = check_limits(resources(), 128, 0, (1, 1, 1), (1, 1, 128), H200)
    assert message is not None and "block dimension z is 128" in message and "64" in message
    message = check_limits(resources(), 32, 0, (1, 70000, 1), (32, 1, 1), H200)
    assert message is not None and "grid dimension y is 70000" in message and "65535" in message


def test_registers_times_threads() -> None:
    message = check_limits(resources(registers=128), 1024, 0, (1, 1, 1), (1024, 1, 1), H200)
    assert message is not None
    assert "131072" in message and "65536" in message and "regsPerBlock" in message
    assert check_limits(resources(registers=64), 1024, 0, (1, 1, 1), (1024, 1, 1), H200) is None


def test_static_plus_dynamic_shared_memory() -> None:
    message = check_limits(resources(shared=1024), 128, 232448, (1, 1, 1), (128, 1, 1), H200)
    assert message is not None
    assert "233472" in message and "232448" in message and "sharedMemPerBlockOptin" in message


def test_launch_geometry(vadd: Experiment) -> None:
    assert vadd.launch is not None
    geometry = launch_geometry(vadd.launch, {**vadd.sizes, **config(block=256, smem_kb=2)})
    assert geometry.grid == (40, 1, 1)  # cdiv(10000, 256)
    assert geometry.block == (256, 1, 1)
    assert geometry.threads == 256
    assert geometry.dynamic_shared_bytes == 2048


def test_launch_geometry_refuses_zero_and_fractions(vadd: Experiment) -> None:
    assert vadd.launch is not None
    with pytest.raises(ValueError, match="division or modulo by zero"):
        launch_geometry(vadd.launch, {**vadd.sizes, **config(block=0)})
    with pytest.raises(ValueError, match="whole number"):
        launch_geometry(vadd.launch, {**vadd.sizes, **config(smem_kb=0.1)})  # type: ignore[arg-type]
    plain = LaunchSpec(
        grid=(Expression.parse("G"), Expression.parse("H")),
        block=(Expression.parse("B"),),
        shared_memory=Expression.parse("S"),
    )
    assert launch_geometry(plain, {"G": 2, "H": 3, "B": 32, "S": 0}).grid == (2, 3, 1)
    with pytest.raises(ValueError, match="grid dimension y is 0"):
        launch_geometry(plain, {"G": 2, "H": 0, "B": 32, "S": 0})
    with pytest.raises(ValueError, match="block dimension x is -32"):
        launch_geometry(plain, {"G": 2, "H": 1, "B": -32, "S": 0})
    with pytest.raises(ValueError, match="dynamic shared memory is -1 bytes"):
        launch_geometry(plain, {"G": 2, "H": 1, "B": 32, "S": -1})


# --------------------------------------------------------------------------- error names


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch",
            "resource",
        ),
        ("cudaErrorLaunchOutOfResources: too many resources requested for launch", "resource"),
        ("CUDA_ERROR_INVALID_VALUE: invalid argument", "launch"),
        ("cudaErrorInvalidConfiguration: invalid configuration argument", "launch"),
        ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered", "runtime"),
        ("cudaErrorIllegalAddress: an illegal memory access was encountered", "runtime"),
        ("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address", "runtime"),
        ("cudaErrorMisalignedAddress: misaligned address", "runtime"),
        ("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", "runtime"),
        ("cudaErrorLaunchFailure: unspecified launch failure", "runtime"),
        ("CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered", "runtime"),
        ("CUDA_ERROR_HARDWARE_STACK_ERROR: hardware stack error", "runtime"),
        ("cudaErrorAssert: device-side assert triggered", "runtime"),
        ("CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available", "compile"),
        ("CUDA_ERROR_NOT_FOUND: named symbol not found", "compile"),
        ("something without a CUDA error name", "runtime"),
    ],
)
def test_classify_cuda_error(message: str, status: str) -> None:
    assert classify_cuda_error(message) is Status(status)


# --------------------------------------------------------------------------- inputs and checks


def test_random_fills_are_never_all_zero() -> None:
    for seed in range(200):
        rng = np.random.default_rng(seed)
        for dtype in ("float32", "float64", "float16", "int32", "int8", "uint16", "complex64"):
            for fill in ("random", "randint"):
                array = fill_array((1,), np.dtype(dtype), fill, rng)
                assert array.dtype == np.dtype(dtype)
                assert np.any(array != 0), (seed, dtype, fill)
        assert np.any(fill_array((1,), np.dtype(bool), "random", rng))


def test_random_fill_ranges() -> None:
    rng = np.random.default_rng(0)
    floats = fill_array((1000,), np.dtype("float32"), "random", rng)
    assert floats.min() >= -1.0 and floats.max() < 1.0 and len(np.unique(floats)) > 900
    ints = fill_array((1000,), np.dtype("int32"), "random", rng)
    assert ints.min() >= -8 and ints.max() < 8 and len(np.unique(ints)) > 10
    unsigned = fill_array((1000,), np.dtype("uint8"), "randint", rng)
    assert unsigned.min() >= 0 and unsigned.max() < 16


def test_literal_fills() -> None:
    rng = np.random.default_rng(0)
    assert not np.any(fill_array((5,), np.dtype("float32"), "zeros", rng))
    assert np.all(fill_array((5,), np.dtype("int64"), "ones", rng) == 1)


def test_poison() -> None:
    floats = np.zeros(4, np.float32)
    poison(floats)
    assert np.all(np.isnan(floats))
    ints = np.zeros(4, np.int32)
    poison(ints)
    assert np.all(ints == np.iinfo(np.int32).min)
    unsigned = np.zeros(4, np.uint16)
    poison(unsigned)
    assert np.all(unsigned == np.iinfo(np.uint16).max)
    flags = np.zeros(4, bool)
    poison(flags)
    assert np.all(flags.view(np.uint8) == 0xFF)
    assert np.all(
        np.isnan(fill_array((3,), np.dtype("float64"), "output", np.random.default_rng()))
    )


def test_reset_output_zeroes_accumulating_outputs_and_poisons_the_rest() -> None:
    """An output declared ``fill = "zeros"`` (a kernel that accumulates into it with atomics)
    starts each check at zero; every other output starts poisoned."""
    summed = np.full(3, 7.0, np.float32)
    reset_output(summed, "zeros")
    assert np.all(summed == 0)
    written = np.full(3, 7.0, np.float32)
    reset_output(written, "output")
    assert np.all(np.isnan(written))
    reset_output(written, "random")
    assert np.all(np.isnan(written))


def test_create_inputs(vadd: Experiment) -> None:
    inputs = create_inputs(vadd.arguments, vadd.sizes, seed=5)
    assert inputs["a"].shape == (10000,) and inputs["a"].dtype == np.float32
    assert np.any(inputs["a"] != inputs["b"])
    assert np.all(np.isnan(inputs["c"]))
    assert inputs["n"] == 10000 and isinstance(inputs["n"], np.int32)
    again = create_inputs(vadd.arguments, vadd.sizes, seed=5)
    assert np.array_equal(inputs["a"], again["a"])  # a restarted worker sees the same inputs
    other = create_inputs(vadd.arguments, vadd.sizes, seed=6)
    assert not np.array_equal(inputs["a"], other["a"])


def test_relative_l2_error() -> None:
    reference = np.array([3.0, 4.0])
    assert relative_l2_error(reference.astype(np.float32), reference) == 0.0
    assert relative_l2_error(np.array([3.0, 4.5]), reference) == pytest.approx(0.5 / 5.0)
    assert relative_l2_error(np.array([3.0, np.nan]), reference) == math.inf
    assert relative_l2_error(np.array([np.inf, 4.0]), reference) == math.inf
    assert relative_l2_error(np.array([0.0, 0.5]), np.zeros(2)) == 0.5  # absolute when ref is 0
    assert relative_l2_error(np.ones((2, 2)), np.ones(4)) == 0.0  # shapes may differ, sizes not
    with pytest.raises(ValueError, match="3 elements"):
        relative_l2_error(np.ones(3), reference)
    ints = np.array([1, 2, np.iinfo(np.int32).min], np.int32)  # an unwritten, poisoned element
    assert relative_l2_error(ints, np.array([1, 2, 3])) > 1e8
    complex_ref = np.array([1 + 1j, 2.0])
    assert relative_l2_error(complex_ref.astype(np.complex64), complex_ref, xp=np) == 0.0


def test_compute_expected(vadd: Experiment) -> None:
    inputs = create_inputs(vadd.arguments, vadd.sizes, seed=0)
    expected = compute_expected(vadd, inputs)
    assert list(expected) == ["c"]
    np.testing.assert_array_equal(expected["c"], inputs["a"] + inputs["b"])


def test_compute_expected_needs_every_output(vadd: Experiment, tmp_path: Path) -> None:
    (tmp_path / "ref.py").write_text("def vadd(a, b, c, n):\n    return {}\n")
    with pytest.raises(ValueError, match="returned no 'c'"):
        compute_expected(vadd, create_inputs(vadd.arguments, vadd.sizes, seed=0))
    (tmp_path / "ref.py").write_text("def vadd(a, b, c, n):\n    return {'c': a * float('nan')}\n")
    with pytest.raises(ValueError, match="NaN or inf"):
        compute_expected(vadd, create_inputs(vadd.arguments, vadd.sizes, seed=0))


# --------------------------------------------------------------------------- fake GPU pipeline


def fake_gpu(init: Any) -> tuple[dict[str, Any], Callable[[LaunchJob], LaunchReply]]:
    """A worker that answers like an H200 without one: BLOCK=32 crashes the process, BLOCK=64
    fails verification, anything over the device limit is a bug (the parent must not send it)."""

    def handle(job: LaunchJob) -> LaunchReply:
        assert job.cubin.startswith(b"\x7fELF"), "expected a cubin"
        threads = job.block[0] * job.block[1] * job.block[2]
        assert threads <= H200["maxThreadsPerBlock"], "launched past the device limit"
        if job.block[0] == 32:
            os._exit(5)
        if job.block[0] == 64:
            return LaunchReply(Status.CORRECTNESS, verification_error=0.5, error="bad output")
        times = tuple(float(i + 1) for i in range(job.repeats))
        return LaunchReply(Status.OK, times_ms=times, verification_error=0.0, benchmark_time_ms=7)

    return dict(H200), handle


def fake_factory(experiment: Experiment, device_id: int) -> WorkerHandle:
    return WorkerHandle(fake_gpu, None, start_timeout_s=60.0, name="fake-gpu")


@pytest.fixture
def fake_backend(vadd: Experiment) -> Iterator[CudaBackend]:
    with CudaBackend(vadd, worker_factory=fake_factory) as backend:
        yield backend


def test_backend_satisfies_the_protocols(fake_backend: CudaBackend) -> None:
    assert isinstance(fake_backend, Backend)
    assert isinstance(fake_backend, DescribesDevice)
    assert fake_backend.evaluate([]) == []


def test_backend_needs_kernel_launch_and_reference(vadd: Experiment) -> None:
    with pytest.raises(ValueError, match=r"needs \[reference\]"):
        CudaBackend(dataclasses.replace(vadd, reference=None), worker_factory=fake_factory)


def test_watchdog_covers_every_launch(fake_backend: CudaBackend) -> None:
    # kernel_timeout 2 s x (1 checked + 1 warm-up + 3 timed) + margin
    assert fake_backend.watchdog_s == pytest.approx(2 * 5 + 10)


@pytest.mark.nvcc
def test_fake_gpu_pipeline(fake_backend: CudaBackend) -> None:
    configs = [
        config(block=128),  # ok
        config(block=128, mode=9),  # does not compile
        config(block=2048),  # too many threads: refused before launching
        config(block=128, smem_kb=300),  # too much shared memory: refused before launching
        config(block=64),  # the fake says: wrong output
        config(block=32),  # the fake crashes the worker
        config(block=256, smem_kb=100),  # ok on a fresh worker
    ]
    results = fake_backend.evaluate(configs)
    assert [r.status for r in results] == [
        Status.OK,
        Status.COMPILE,
        Status.RESOURCE,
        Status.RESOURCE,
        Status.CORRECTNESS,
        Status.RUNTIME,
        Status.OK,
    ]
    assert [r.config for r in results] == configs

    ok = results[0]
    assert ok.times_ms == (1.0, 2.0, 3.0)  # repeats = 3
    assert ok.objective == 2.0  # metric "time": the median
    assert ok.benchmark_time_ms == 7
    assert ok.threads_per_block == 128
    assert ok.shared_bytes == 1024
    assert ok.registers is not None and ok.registers > 0
    assert ok.compile_time_ms is not None and ok.compile_time_ms > 0
    assert ok.verification_error == 0.0

    assert "MODE 9 does not compile" in results[1].error
    assert results[1].compile_time_ms is not None

    assert "2048" in results[2].error and "1024" in results[2].error
    assert results[2].threads_per_block == 2048 and results[2].registers is not None
    assert "sharedMemPerBlockOptin" in results[3].error
    assert results[3].shared_bytes == 300 * 1024

    assert results[4].error == "bad output" and results[4].verification_error == 0.5
    assert results[5].error == "worker process died (exit code 5)"
    assert results[5].registers is not None  # what is known is kept on failures
    assert results[6].shared_bytes == 100 * 1024


@pytest.mark.nvcc
def test_device_comes_from_the_worker(fake_backend: CudaBackend) -> None:
    assert fake_backend.device()["name"] == "NVIDIA H200"
    assert fake_backend.device()["arch"] == "sm_90"


# --------------------------------------------------------------------------- on the GPU


@pytest.fixture
def gpu_backend(vadd: Experiment) -> Iterator[CudaBackend]:
    with CudaBackend(vadd) as backend:
        yield backend


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_correct_configs(gpu_backend: CudaBackend) -> None:
    results = gpu_backend.evaluate([config(block=128), config(block=256, smem_kb=100)])
    for result in results:
        assert result.status is Status.OK, result.error
        assert len(result.times_ms) == 3
        assert all(t > 0 for t in result.times_ms)
        assert result.objective == result.time_ms
        assert result.verification_error is not None and result.verification_error <= 1e-6
        assert result.registers is not None and result.threads_per_block == result.config["BLOCK"]
    device = gpu_backend.device()
    assert device["maxThreadsPerBlock"] >= 1024 and device["arch"].startswith("sm_")


@pytest.mark.gpu
def test_gpu_check_on_the_device_equals_the_host_check() -> None:
    import cupy

    rng = np.random.default_rng(0)
    expected = rng.standard_normal(1 << 22)
    output = (expected * (1 + 1e-6 * rng.standard_normal(expected.size))).astype(np.float32)
    on_gpu = relative_l2_error(cupy.asarray(output), cupy.asarray(expected), xp=cupy)
    assert on_gpu == pytest.approx(relative_l2_error(output, expected), rel=1e-9)
    assert 1e-8 < on_gpu < 1e-5
    output[12345] = np.nan  # an unwritten, poisoned element
    assert relative_l2_error(cupy.asarray(output), cupy.asarray(expected), xp=cupy) == math.inf


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_half_written_output_is_a_correctness_failure(gpu_backend: CudaBackend) -> None:
    (result,) = gpu_backend.evaluate([config(mode=1)])
    assert result.status is Status.CORRECTNESS, result.error
    assert "NaN" in result.error
    assert result.times_ms == ()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_oversized_block_is_refused_without_launching(gpu_backend: CudaBackend) -> None:
    (result,) = gpu_backend.evaluate([config(block=2048)])
    assert result.status in (Status.RESOURCE, Status.LAUNCH), result.error
    assert result.benchmark_time_ms is None  # the worker never saw it


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_illegal_address_replaces_the_worker(gpu_backend: CudaBackend) -> None:
    bad, good = gpu_backend.evaluate([config(mode=2), config(block=256)])
    assert bad.status is Status.RUNTIME, bad.error
    assert "illegal" in bad.error.lower()
    assert good.status is Status.OK, good.error


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_endless_kernel_times_out(gpu_backend: CudaBackend) -> None:
    hung, good = gpu_backend.evaluate([config(mode=3), config(block=128)])
    assert hung.status is Status.TIMEOUT, hung.error
    assert good.status is Status.OK, good.error


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_gemm_experiment() -> None:
    gemm_template, gemm_experiment = TEMPLATES / "gemm.cu", EXPERIMENTS / "gemm.toml"
    if not (gemm_template.is_file() and gemm_experiment.is_file()):
        pytest.skip("templates/gemm.cu and experiments/gemm.toml are not there yet")
    from surrotune.space import SearchSpace

    experiment = load_experiment(gemm_experiment).with_overrides(warmup=1, repeats=3)
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    frame = space.sample(6, np.random.default_rng(0))
    configs = [
        {name: value.item() if hasattr(value, "item") else value for name, value in row.items()}
        for row in frame.to_dict("records")
    ]
    with CudaBackend(experiment) as backend:
        results = backend.evaluate(configs)
    statuses = [r.status for r in results]
    assert Status.OK in statuses, [(r.config, r.status, r.error[:200]) for r in results]
    wrong = [r for r in results if r.status in (Status.CORRECTNESS, Status.RUNTIME)]
    assert not wrong, [(r.config, r.status, r.error[:200]) for r in wrong]


# --------------------------------------------------------------------------- the worker body
# cuda_worker and its job loop, run in this process against a NumPy imitation of the few CuPy
# calls they make: what they verify, poison, restore and classify is checked without a GPU.


class _FakeDriverError(Exception):
    pass


class _FakeRuntimeError(Exception):
    pass


class _DeviceArray(np.ndarray):
    copies_to_host = 0  # how many times an array came back to the host

    def get(self) -> np.ndarray:
        _DeviceArray.copies_to_host += 1
        return np.array(self)


class _FakeOutOfMemory(Exception):
    pass


class _FakeEvent:
    def __init__(self) -> None:
        self.ticks = 0

    def record(self) -> None:
        self.ticks = _FakeGpu.clock

    def synchronize(self) -> None:
        _FakeGpu.synchronize()


class _FakeGpu:
    """A clock that advances 5 ticks per launch, and kernels by cubin content: b"add",
    b"half" (writes half), b"noop" (writes nothing), b"illegal" (faults, seen at
    synchronize), b"oor" (launch refused: out of resources)."""

    clock = 0
    pending: str | None = None
    launches = 0
    free_bytes = 80 * 2**30  # what memGetInfo says is free

    @classmethod
    def synchronize(cls) -> None:
        if cls.pending is not None:
            raise _FakeRuntimeError(cls.pending)

    class Module:
        def load(self, cubin: bytes) -> None:
            self.kind = cubin

        def get_function(self, name: str) -> Any:
            if name != "vadd":
                raise _FakeDriverError("CUDA_ERROR_NOT_FOUND: named symbol not found")
            return _FakeFunction(self.kind)


def _fake_func_set_attribute(pointer: int, attribute: int, value: int) -> None:
    """cuFuncSetAttribute, as CuPy 14 exposes it (Function has no settable attribute)."""
    assert attribute == 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _FakeFunction.by_pointer[pointer].max_dynamic_shared_size_bytes = value


class _FakeFunction:
    by_pointer: ClassVar[dict[int, _FakeFunction]] = {}

    def __init__(self, kind: bytes) -> None:
        self.kind = kind
        self.max_dynamic_shared_size_bytes = 0
        self.ptr = id(self)
        _FakeFunction.by_pointer[self.ptr] = self

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        _FakeGpu.launches += 1
        _FakeGpu.clock += 5
        if self.kind == b"oor":
            raise _FakeDriverError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources")
        if self.kind == b"illegal":
            _FakeGpu.pending = "cudaErrorIllegalAddress: an illegal memory access was encountered"
            return
        if self.kind == b"noop":
            return
        a, b, c, n = args
        stop = n // 2 if self.kind == b"half" else n
        c[:stop] = a[:stop] + b[:stop]


def _fake_cupy() -> Any:
    from types import SimpleNamespace

    class Device:
        def __init__(self, device_id: int = 0) -> None:
            pass

        def use(self) -> None:
            pass

        def synchronize(self) -> None:
            _FakeGpu.synchronize()

    def properties(device_id: int) -> dict[str, Any]:
        props = {k: v for k, v in H200.items() if k not in ("arch", "device_id", "clockRate")}
        props["name"] = b"NVIDIA H200"
        props["maxThreadsDim"] = (1024, 1024, 64)
        return props

    runtime = SimpleNamespace(
        CUDARuntimeError=_FakeRuntimeError,
        getDeviceProperties=properties,
        deviceGetAttribute=lambda attribute, device: 1980000 if attribute == 13 else -1,
        runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000,
        memGetInfo=lambda: (_FakeGpu.free_bytes, 141 * 2**30),
    )
    cuda = SimpleNamespace(
        Device=Device,
        Event=_FakeEvent,
        get_elapsed_time=lambda start, end: float(end.ticks - start.ticks),
        runtime=runtime,
        driver=SimpleNamespace(
            CUDADriverError=_FakeDriverError,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
            funcSetAttribute=_fake_func_set_attribute,
        ),
        function=SimpleNamespace(Module=_FakeGpu.Module),
        memory=SimpleNamespace(OutOfMemoryError=_FakeOutOfMemory),
    )
    # the array functions that the check on the GPU uses, NumPy's (CuPy's have the same meaning)
    return SimpleNamespace(
        cuda=cuda,
        asarray=lambda x: np.array(x).view(_DeviceArray),
        float64=np.float64,
        complex128=np.complex128,
        all=np.all,
        isfinite=np.isfinite,
        linalg=np.linalg,
        get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
    )


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Any:
    import sys

    _FakeGpu.pending, _FakeGpu.launches = None, 0
    _FakeGpu.free_bytes = 80 * 2**30
    _DeviceArray.copies_to_host = 0
    module = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def job(kind: bytes, *, name: str = "vadd", shared: int = 0) -> LaunchJob:
    return LaunchJob(kind, name, (40, 1, 1), (256, 1, 1), shared, warmup=2, repeats=3)


def test_worker_body_times_a_correct_kernel(vadd: Experiment, fake_cupy: Any) -> None:
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    props, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    assert props["name"] == "NVIDIA H200" and props["maxThreadsDim"] == [1024, 1024, 64]
    assert props["arch"] == "sm_90" and props["clockRate"] == 1980000
    reply = handle(job(b"add"))
    assert isinstance(reply, LaunchReply) and reply.status is Status.OK, reply.error
    assert reply.times_ms == (5.0, 5.0, 5.0)  # each timed launch between its own two events
    assert reply.verification_error == 0.0
    assert _FakeGpu.launches == 1 + 2 + 3  # checked, warm-up, timed
    # a second job is verified against freshly poisoned outputs, not the previous results
    assert handle(job(b"half")).status is Status.CORRECTNESS


def test_worker_checks_outputs_on_the_gpu_where_they_fit(vadd: Experiment, fake_cupy: Any) -> None:
    """The reference goes to the GPU once; a check then copies nothing back but scalars."""
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    _, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    assert handle(job(b"add")).status is Status.OK
    bad = handle(job(b"half"))
    assert bad.status is Status.CORRECTNESS and bad.verification_error == math.inf
    assert _DeviceArray.copies_to_host == 0


def test_worker_checks_on_the_host_where_the_gpu_is_short(
    vadd: Experiment, fake_cupy: Any
) -> None:
    """Too little free memory for the reference and two temporaries: the host checks, alike."""
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    _FakeGpu.free_bytes = 1000  # vadd's reference is 10,000 doubles
    _, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    good, bad = handle(job(b"add")), handle(job(b"half"))
    assert good.status is Status.OK and good.verification_error == 0.0
    assert bad.status is Status.CORRECTNESS and bad.verification_error == math.inf
    assert _DeviceArray.copies_to_host == 2  # one output copied back per check


def test_worker_falls_back_to_the_host_when_the_check_runs_out_of_memory(
    vadd: Experiment, fake_cupy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An out-of-memory error in the GPU check costs that check's place, not the trial."""
    from surrotune.backends import worker
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    host_check = worker.relative_l2_error

    def short_of_memory(output: Any, expected: Any, xp: Any = np) -> float:
        if xp is not np:
            raise _FakeOutOfMemory("out of memory allocating 80,000 bytes")
        return host_check(output, expected)

    monkeypatch.setattr(worker, "relative_l2_error", short_of_memory)
    _, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    first, second = handle(job(b"add")), handle(job(b"add"))
    assert first.status is Status.OK and first.verification_error == 0.0
    assert second.status is Status.OK
    assert _DeviceArray.copies_to_host == 2  # the GPU check was tried once, then left off


def test_worker_body_reports_unwritten_outputs(vadd: Experiment, fake_cupy: Any) -> None:
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    _, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    reply = handle(job(b"half"))
    assert reply.status is Status.CORRECTNESS
    assert "'c'" in reply.error and "NaN" in reply.error
    assert reply.verification_error == math.inf
    assert reply.times_ms == () and _FakeGpu.launches == 1  # not timed


def test_worker_body_classifies_driver_errors(vadd: Experiment, fake_cupy: Any) -> None:
    from surrotune.backends.worker import CudaWorkerInit, Retire, cuda_worker

    _, handle = cuda_worker(CudaWorkerInit(vadd, 0))
    refused = handle(job(b"oor"))
    assert refused.status is Status.RESOURCE and "launching" in refused.error
    missing = handle(job(b"add", name="other"))
    assert missing.status is Status.COMPILE and "'other'" in missing.error
    opted_in = handle(job(b"add", shared=100 * 1024))
    assert opted_in.status is Status.OK
    fault = handle(job(b"illegal"))
    assert isinstance(fault, Retire)  # sticky: this process must not serve another job
    assert fault.value.status is Status.RUNTIME
    assert "running" in fault.value.error and "IllegalAddress" in fault.value.error


def test_worker_body_poisons_every_output(tmp_path: Path, fake_cupy: Any) -> None:
    """An output with a random fill is still poisoned: a kernel that leaves it alone fails, even
    though its initial content is exactly what this reference expects."""
    from surrotune.backends.worker import CudaWorkerInit, cuda_worker

    (tmp_path / "keep.cu").write_text("// ${BLOCK}\n")
    (tmp_path / "ref.py").write_text(
        "import numpy as np\n"
        "def keep(x):\n"
        "    assert np.all(np.isfinite(x)) and np.any(x)  # the reference sees the fill\n"
        "    return {'x': x}\n"
    )
    (tmp_path / "keep.toml").write_text(
        '[kernel]\ntemplate = "keep.cu"\nname = "vadd"\n[sizes]\nN = 100\n'
        '[[arguments]]\nname = "x"\ndtype = "float64"\nshape = ["N"]\noutput = true\n'
        '[launch]\ngrid = [1]\nblock = ["BLOCK"]\n[parameters]\nBLOCK = [32]\n'
        '[reference]\nfunction = "ref.py:keep"\n'
    )
    experiment = load_experiment(tmp_path / "keep.toml")
    assert experiment.arguments[0].fill == "random"
    _, handle = cuda_worker(CudaWorkerInit(experiment, 0))
    reply = handle(job(b"noop"))
    assert reply.status is Status.CORRECTNESS and "'x' holds NaN" in reply.error


def test_the_parent_never_imports_cupy() -> None:
    """A CUDA context in the parent would share the fate of every sticky error in the worker."""
    import subprocess
    import sys

    code = (
        "import sys, surrotune.backends.cuda, surrotune.backends.worker; "
        "sys.exit(1 if 'cupy' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0
