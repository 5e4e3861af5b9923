"""On the GPU: the occupancy calculator against the driver, the device limits it reads, and the
worker's timing loop (adaptive repeats, every time kept, the L2 flush, the clocks).

Run on a machine with a GPU and CuPy:  python3 -m pytest -m gpu tests/backends/test_gpu_measure.py
Elsewhere every test here is skipped, loudly (tests/conftest.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from surrotune.backends.compile import CompiledKernel, CompileRequest, compile_many
from surrotune.backends.cuda import CudaBackend, kernel_occupancy, launch_geometry
from surrotune.backends.measure import relative_precision
from surrotune.backends.occupancy import DeviceLimits, occupancy, shared_memory_configs
from surrotune.backends.worker import DEVICE_PROPERTIES, device_properties
from surrotune.experiment import load_experiment
from surrotune.result import Result, Status
from surrotune.template import Template

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu

#: cuFuncGetAttribute numbers
_NUM_REGS, _SHARED_SIZE_BYTES, _MAX_DYNAMIC_SHARED = 4, 1, 8
#: block sizes and dynamic shared memory swept for every compiled kernel
THREADS = (32, 64, 96, 128, 160, 192, 256, 288, 384, 512, 640, 768, 800, 896, 1024)
DYNAMIC = (0, 1000, 8 * 1024, 40 * 1024, 64 * 1024, 100 * 1024, 150 * 1024, 200 * 1024)


@pytest.fixture(scope="module")
def cupy() -> Any:
    import cupy

    cupy.cuda.Device(0).use()
    return cupy


@pytest.fixture(scope="module")
def props(cupy: Any) -> dict[str, Any]:
    return device_properties(cupy, 0)


# --------------------------------------------------------------------------- device limits


def test_gpu_device_limits_are_consistent(props: dict[str, Any]) -> None:
    """What the worker reports is complete, and agrees with the calculator's own tables."""
    missing = [key for key in DEVICE_PROPERTIES if props.get(key) is None]
    assert not missing, f"the hello lacks {missing}"
    limits = DeviceLimits.from_properties(props)
    major, minor = props["major"], props["minor"]
    tiny = occupancy(limits, registers=16, threads=32, barriers=0)
    assert tiny.block_limits["blocks"] == props["maxBlocksPerMultiProcessor"]
    assert props["sharedMemPerMultiprocessor"] in shared_memory_configs(major, minor)
    if major >= 8:
        assert props["reservedSharedMemPerBlock"] == 1024
        assert (
            props["sharedMemPerBlockOptin"] + props["reservedSharedMemPerBlock"]
            == props["sharedMemPerMultiprocessor"]
        )
    assert limits.max_warps_per_sm * props["warpSize"] == props["maxThreadsPerMultiProcessor"]
    assert props["regsPerMultiprocessor"] == 65536 and props["l2CacheSize"] > 0
    assert props["pciBusId"], "the PCI bus id addresses NVML and nvidia-smi"
    if "H200" in props["name"] or "H100" in props["name"]:
        assert props["arch"] == "sm_90" and props["maxBlocksPerMultiProcessor"] == 32
        assert props["sharedMemPerMultiprocessor"] == 228 * 1024


# --------------------------------------------------------------------------- occupancy


def _compare_with_driver(
    cupy: Any,
    limits: DeviceLimits,
    pointer: int,
    barriers: int,
    threads: Sequence[int] = THREADS,
    dynamic: Sequence[int] = DYNAMIC,
) -> tuple[int, int, list[str]]:
    """Our occupancy against cuOccupancyMaxActiveBlocksPerMultiprocessor for every block size
    and dynamic size, with the function's attributes read back from the driver.

    Dynamic sizes above the default limit are opted in first, as the worker does; the attribute
    then stays set, so the maximum passed to the calculator is read back each time.
    """
    driver = cupy.cuda.driver
    registers = driver.funcGetAttribute(_NUM_REGS, pointer)
    static = driver.funcGetAttribute(_SHARED_SIZE_BYTES, pointer)
    compared = zeros = 0
    mismatches: list[str] = []
    for dyn in sorted(dynamic):
        if static + dyn > limits.shared_per_block_optin:
            continue  # the opt-in itself is refused: nothing to launch
        if static + dyn > limits.shared_per_block:
            driver.funcSetAttribute(pointer, _MAX_DYNAMIC_SHARED, dyn)
        current = driver.funcGetAttribute(_MAX_DYNAMIC_SHARED, pointer)
        for block in threads:
            try:
                theirs = driver.occupancyMaxActiveBlocksPerMultiprocessor(pointer, block, dyn)
            except driver.CUDADriverError:
                theirs = 0
            ours = occupancy(
                limits, registers=registers, threads=block, static_shared=static,
                dynamic_shared=dyn, barriers=barriers, max_dynamic_shared=current,
            )  # fmt: skip
            compared += 1
            zeros += theirs == 0
            if ours.active_blocks_per_sm != theirs:
                mismatches.append(
                    f"regs {registers} static {static} dyn {dyn} (max {current}) threads {block}:"
                    f" driver {theirs}, ours {ours.active_blocks_per_sm} ({ours.explain()})"
                )
    return compared, zeros, mismatches


def _gemm_kernels(props: dict[str, Any], count: int) -> list[tuple[dict[str, Any], Any]]:
    from surrotune.space import SearchSpace

    experiment = load_experiment(REPO / "experiments" / "gemm.toml")
    assert experiment.kernel is not None
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    frame = space.sample(count, np.random.default_rng(11))
    template = Template.from_file(experiment.kernel.template)
    envs = [
        {**experiment.sizes, **{k: v.item() if hasattr(v, "item") else v for k, v in row.items()}}
        for row in frame.to_dict("records")
    ]
    requests = [
        CompileRequest(
            source=template.render(env),
            kernel_name=experiment.kernel.name,
            arch=props["arch"],
            options=experiment.kernel.options,
        )
        for env in envs
    ]
    return list(zip(envs, compile_many(requests, timeout_s=600.0), strict=True))


@pytest.mark.nvcc
def test_gpu_occupancy_equals_the_driver_for_gemm_configs(
    cupy: Any, props: dict[str, Any]
) -> None:
    """For a sample of GEMM configurations compiled for this GPU: the backend's occupancy of
    each configuration's own launch, and the calculator over a sweep of block and shared-memory
    sizes, equal cuOccupancyMaxActiveBlocksPerMultiprocessor."""
    limits = DeviceLimits.from_properties(props)
    experiment = load_experiment(REPO / "experiments" / "gemm.toml")
    assert experiment.launch is not None
    compiled = 0
    total = zeros = 0
    mismatches: list[str] = []
    for env, kernel in _gemm_kernels(props, 24):
        if not isinstance(kernel, CompiledKernel):
            continue  # a resource failure of ptxas: nothing to load
        compiled += 1
        resources = kernel.resources
        geometry = launch_geometry(experiment.launch, env)
        module = cupy.cuda.function.Module()
        module.load(kernel.cubin)
        pointer = module.get_function(kernel.kernel_name).ptr
        driver = cupy.cuda.driver
        assert driver.funcGetAttribute(_NUM_REGS, pointer) == resources.registers
        assert (
            driver.funcGetAttribute(_SHARED_SIZE_BYTES, pointer) == resources.shared_static_bytes
        )
        # the backend's own path, for the configuration's launch, before any opt-in
        ours = kernel_occupancy(resources, geometry.threads, geometry.dynamic_shared_bytes, props)
        theirs = driver.occupancyMaxActiveBlocksPerMultiprocessor(
            pointer, geometry.threads, geometry.dynamic_shared_bytes
        )
        assert ours is not None, "the calculator does not cover this GPU"
        assert ours.active_blocks_per_sm == theirs, (env, theirs, ours.explain())
        count, zero, wrong = _compare_with_driver(cupy, limits, pointer, resources.barriers)
        total, zeros = total + count, zeros + zero
        mismatches += [f"{env}: {line}" for line in wrong]
    assert compiled >= 12, "too few GEMM configurations compiled to compare"
    assert not mismatches, f"{len(mismatches)} of {total} differ:\n" + "\n".join(mismatches[:20])
    assert 0 < zeros < total  # launches that fit and launches that do not were both compared


RAW = """
#define S ${S}
extern "C" __global__ void pressure(float* out, const float* in) {
    __shared__ float buf[S];
    float a[96];
#pragma unroll
    for (int j = 0; j < 96; ++j) a[j] = in[threadIdx.x + j * blockDim.x];
    buf[threadIdx.x % S] = a[0];
    __syncthreads();
    float s = buf[(threadIdx.x + 1) % S];
#pragma unroll
    for (int j = 0; j < 96; ++j) s += a[j] * a[(j * 7) % 96];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def test_gpu_occupancy_equals_the_driver_for_register_and_shared_pressure(
    cupy: Any, props: dict[str, Any]
) -> None:
    """Kernels compiled by NVRTC with register caps from 32 to 255 and static shared memory up
    to 48 KB, over every block and dynamic size: no nvcc needed."""
    limits = DeviceLimits.from_properties(props)
    total = zeros = 0
    mismatches: list[str] = []
    registers_seen = set()
    for cap in (32, 40, 64, 72, 96, 128, 168, 255):
        for floats in (1, 1024, 4000, 12288):
            source = Template(path=None, text=RAW).render({"S": floats})
            kernel = cupy.RawKernel(source, "pressure", options=(f"--maxrregcount={cap}",))
            pointer = kernel.kernel.ptr
            registers_seen.add(kernel.num_regs)
            count, zero, wrong = _compare_with_driver(cupy, limits, pointer, barriers=1)
            total, zeros = total + count, zeros + zero
            mismatches += [f"cap {cap} shared {4 * floats}: {line}" for line in wrong]
    assert not mismatches, f"{len(mismatches)} of {total} differ:\n" + "\n".join(mismatches[:20])
    assert len(registers_seen) >= 4 and 0 < zeros < total


# --------------------------------------------------------------------------- the timing loop

COPY = """\
extern "C" __global__ void copy(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * ${BLOCK} + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""

COPY_EXPERIMENT = """\
[kernel]
template = "copy.cu"
name = "copy"

[sizes]
N = {n}

[[arguments]]
name = "x"
dtype = "float32"
shape = ["N"]

[[arguments]]
name = "y"
dtype = "float32"
shape = ["N"]
output = true

[[arguments]]
name = "n"
dtype = "int32"
value = "N"

[launch]
grid = ["cdiv(N, BLOCK)"]
block = ["BLOCK"]

[parameters]
BLOCK = [256]

[reference]
function = "ref.py:copy"

[evaluation]
kernel_timeout = 5
{evaluation}
"""


def _run(
    tmp_path: Path, n: int, evaluation: str, name: str = "copy"
) -> tuple[Result, dict[str, Any]]:
    """The vector copy of ``n`` floats, evaluated once with this [evaluation] table, and the
    device as its worker reported it."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "copy.cu").write_text(COPY)
    (directory / "ref.py").write_text("def copy(x, y, n):\n    return {'y': x}\n")
    (directory / "e.toml").write_text(COPY_EXPERIMENT.format(n=n, evaluation=evaluation))
    with CudaBackend(load_experiment(directory / "e.toml")) as backend:
        (result,) = backend.evaluate([{"BLOCK": 256}])
        device = backend.device()
    assert result.status is Status.OK, result.error
    return result, device


def test_gpu_adaptive_timing_keeps_every_time_and_records_the_clocks(
    tmp_path: Path, props: dict[str, Any]
) -> None:
    n = 1 << 20  # 8 MB: fits in the L2 of any GPU surrotune targets
    evaluation = (
        "warmup = 3\nmin_repeats = 10\nmax_repeats = 300\ntarget_precision = 0.01\n"
        'max_measure_time = "3s"\nl2_flush = "auto"'
    )
    result, device = _run(tmp_path, n, evaluation)
    times = result.times_ms
    assert len(times) >= 10 and all(t > 0 for t in times)
    assert result.timing_precision == pytest.approx(relative_precision(times))
    if result.timing_stop == "precision":
        assert result.timing_precision is not None and result.timing_precision <= 0.01
    elif result.timing_stop == "max_repeats":
        assert len(times) == 300
    else:
        assert result.timing_stop == "max_measure_time", result.timing_stop
    assert result.time_ms == statistics.median(times)
    assert 8 * n <= props["l2CacheSize"] and result.l2_flush is True
    clocks = device["clocks"]
    assert clocks["source"] in ("pynvml", "nvidia-smi"), clocks["note"]
    assert clocks["at_start"]["sm_clock_mhz"] > 0
    assert result.sm_clock_mhz is not None and result.sm_clock_mhz > 0
    assert result.memory_clock_mhz is not None and result.memory_clock_mhz > 0
    assert result.occupancy == 1.0 and result.active_blocks_per_sm is not None


def test_gpu_fixed_repeats_and_a_working_set_larger_than_the_l2(
    tmp_path: Path, props: dict[str, Any]
) -> None:
    n = props["l2CacheSize"] // 4  # two arrays of one L2 each: twice the L2
    result, _ = _run(tmp_path, n, "warmup = 2\nrepeats = 5")
    assert len(result.times_ms) == 5 and result.timing_stop == "repeats"
    assert result.l2_flush is False


def test_gpu_the_flush_evicts_what_fits(tmp_path: Path, props: dict[str, Any]) -> None:
    """A copy of half the L2 reads its input from the L2 when nothing flushes it, from memory
    when the flush runs before each launch: flushed launches are slower."""
    n = props["l2CacheSize"] // 16  # two arrays: half the L2
    flushed, _ = _run(tmp_path, n, 'repeats = 50\nl2_flush = "always"', name="flushed")
    warm, _ = _run(tmp_path, n, 'repeats = 50\nl2_flush = "never"', name="warm")
    assert flushed.l2_flush is True and warm.l2_flush is False
    assert flushed.time_ms is not None and warm.time_ms is not None
    assert flushed.time_ms > warm.time_ms, (flushed.time_ms, warm.time_ms)
