"""The occupancy calculator: hand-computed cases, NVIDIA's documented example, and the port
checked against cuda_occupancy.h itself (compiled with nvcc) on thousands of random launches.

The GPU check, against the driver's cuOccupancyMaxActiveBlocksPerMultiprocessor, is in
tests/backends/test_gpu_measure.py.
"""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from surrotune.backends.compile import KernelResources
from surrotune.backends.cuda import check_limits, kernel_occupancy, occupancy_fields
from surrotune.backends.occupancy import (
    DeviceLimits,
    OccupancyError,
    occupancy,
    occupancy_arrays,
    shared_memory_configs,
)
from surrotune.runner import device_limits

#: as cudaGetDeviceProperties reports them, per architecture (H200, A100, RTX 3090/4090, T4, ...)
DEVICES: dict[str, dict[str, int]] = {
    "sm_75": {"major": 7, "minor": 5, "maxThreadsPerMultiProcessor": 1024,
              "sharedMemPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 65536,
              "reservedSharedMemPerBlock": 0},
    "sm_80": {"major": 8, "minor": 0, "maxThreadsPerMultiProcessor": 2048,
              "sharedMemPerMultiprocessor": 167936, "sharedMemPerBlockOptin": 166912,
              "reservedSharedMemPerBlock": 1024},
    "sm_86": {"major": 8, "minor": 6, "maxThreadsPerMultiProcessor": 1536,
              "sharedMemPerMultiprocessor": 102400, "sharedMemPerBlockOptin": 101376,
              "reservedSharedMemPerBlock": 1024},
    "sm_89": {"major": 8, "minor": 9, "maxThreadsPerMultiProcessor": 1536,
              "sharedMemPerMultiprocessor": 102400, "sharedMemPerBlockOptin": 101376,
              "reservedSharedMemPerBlock": 1024},
    "sm_90": {"major": 9, "minor": 0, "maxThreadsPerMultiProcessor": 2048,
              "sharedMemPerMultiprocessor": 233472, "sharedMemPerBlockOptin": 232448,
              "reservedSharedMemPerBlock": 1024},
    "sm_100": {"major": 10, "minor": 0, "maxThreadsPerMultiProcessor": 2048,
               "sharedMemPerMultiprocessor": 233472, "sharedMemPerBlockOptin": 232448,
               "reservedSharedMemPerBlock": 1024},
    "sm_120": {"major": 12, "minor": 0, "maxThreadsPerMultiProcessor": 1536,
               "sharedMemPerMultiprocessor": 102400, "sharedMemPerBlockOptin": 101376,
               "reservedSharedMemPerBlock": 1024},
}  # fmt: skip
_COMMON = {"maxThreadsPerBlock": 1024, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
           "warpSize": 32, "sharedMemPerBlock": 49152}  # fmt: skip


def props(arch: str) -> dict[str, int]:
    return {**_COMMON, **DEVICES[arch]}


H200 = DeviceLimits.from_properties(props("sm_90"))


# --------------------------------------------------------------------------- documented examples


def test_best_practices_guide_example() -> None:
    """CUDA C++ Best Practices Guide, "Calculating Occupancy": on compute capability 7.0, 37
    registers per thread give 75 % occupancy with 12 blocks of 128 threads, and 63 % with 4
    blocks of 320 threads."""
    volta = DeviceLimits.from_properties(
        {**props("sm_75"), "minor": 0, "maxThreadsPerMultiProcessor": 2048,
         "sharedMemPerMultiprocessor": 98304, "sharedMemPerBlockOptin": 98304}
    )  # fmt: skip
    small = occupancy(volta, registers=37, threads=128)
    assert small.active_blocks_per_sm == 12 and small.fraction == 0.75
    assert small.limiter == "registers"
    large = occupancy(volta, registers=37, threads=320)
    assert large.active_blocks_per_sm == 4 and round(large.fraction, 2) == 0.62  # 40/64 warps
    # "each thread can use at most 32 registers" for 100 %
    assert occupancy(volta, registers=32, threads=256).fraction == 1.0
    assert occupancy(volta, registers=33, threads=256).fraction < 1.0


# --------------------------------------------------------------------------- H200, by hand


def test_full_occupancy_is_limited_by_warps_and_registers() -> None:
    # 8 warps per block: 64 warps / 8 = 8 blocks; 32 registers x 32 lanes = 1024 per warp,
    # 16384 per sub-partition / 1024 = 16 warps x 4 = 64 warps: also 8 blocks
    result = occupancy(H200, registers=32, threads=256)
    assert result.active_blocks_per_sm == 8 and result.active_warps_per_sm == 64
    assert result.fraction == 1.0 and result.limiters == ("warps", "registers")
    assert result.registers_per_block == 8192
    assert result.shared_per_block == 1024  # the driver's reserved kilobyte, even with none used


def test_register_granularity() -> None:
    # 255 registers x 32 = 8160, allocated 8192 per warp: 2 warps per sub-partition, 8 per SM
    result = occupancy(H200, registers=255, threads=128)
    assert result.active_blocks_per_sm == 2 and result.fraction == 8 / 64
    assert result.limiter == "registers" and result.registers_per_block == 4 * 8192
    # 40 registers: 1280 per warp, 12 warps per sub-partition, 48 per SM: 6 blocks of 8 warps
    assert occupancy(H200, registers=40, threads=256).active_blocks_per_sm == 6


def test_one_block_of_1024_threads() -> None:
    fits = occupancy(H200, registers=64, threads=1024)
    assert fits.active_blocks_per_sm == 1 and fits.fraction == 0.5
    # 65 registers round up to 72 (2304 per warp): 32 warps need 73728 > regsPerBlock
    refused = occupancy(H200, registers=65, threads=1024)
    assert refused.active_blocks_per_sm == 0 and not refused.fits
    assert refused.limiter == "registers"
    assert "73728" in refused.explain() and "regsPerBlock 65536" in refused.explain()


def test_sub_partition_rounding_refuses_what_registers_times_threads_allows() -> None:
    """80 x 800 = 64000 registers fit regsPerBlock, but the hardware counts 25 warps as 28 (four
    sub-partitions) at 2560 registers each: 71680. The driver refuses this launch."""
    result = occupancy(H200, registers=80, threads=800)
    assert result.active_blocks_per_sm == 0 and result.limiter == "registers"
    assert "28 over 4 sub-partitions" in result.explain() and "71680" in result.explain()


def test_shared_memory_granularity_and_reserve() -> None:
    # 48 KB + the 1 KB reserve = 50176 per block; 233472 / 50176 = 4 blocks
    result = occupancy(H200, registers=32, threads=128, dynamic_shared=48 * 1024)
    assert result.active_blocks_per_sm == 4 and result.limiter == "shared"
    assert result.shared_per_block == 50176 and result.shared_per_sm == 233472
    # 1 byte more than 2 KB is allocated as 2 KB + 128 B (+ 1 KB reserve)
    odd = occupancy(H200, registers=16, threads=32, static_shared=2049)
    assert odd.shared_per_block == 2048 + 128 + 1024


def test_the_largest_block_on_an_h200() -> None:
    # 227 KB dynamic (the opt-in maximum) + 1 KB reserve = the SM's 228 KB carveout
    result = occupancy(H200, registers=32, threads=256, dynamic_shared=232448)
    assert result.active_blocks_per_sm == 1 and result.limiter == "shared"
    over = occupancy(H200, registers=32, threads=256, dynamic_shared=232448 + 1)
    assert over.active_blocks_per_sm == 0
    assert "exceed the per-block limit of 233472" in over.explain()
    # static counts too: 8 KB static + 220 KB dynamic is over the opt-in maximum
    both = occupancy(H200, registers=32, threads=256, static_shared=8192, dynamic_shared=225280)
    assert both.active_blocks_per_sm == 0 and both.limiter == "shared"


def test_dynamic_shared_over_the_kernel_attribute() -> None:
    """Without the opt-in (the attribute left at its default), 40 KB static + 16 KB dynamic do
    not launch; the worker opts in, so by default they do."""
    refused = occupancy(
        H200, registers=32, threads=128, static_shared=40960, dynamic_shared=16384,
        max_dynamic_shared=49152 - 40960,
    )  # fmt: skip
    assert refused.active_blocks_per_sm == 0 and "maximum dynamic shared size" in refused.explain()
    opted_in = occupancy(
        H200, registers=32, threads=128, static_shared=40960, dynamic_shared=16384
    )
    assert opted_in.active_blocks_per_sm == 4  # 58368 per block in 233472


def test_block_limit_and_barriers() -> None:
    tiny = occupancy(H200, registers=16, threads=32)
    assert tiny.active_blocks_per_sm == 32 and tiny.limiter == "blocks" and tiny.fraction == 0.5
    # Hopper: 64 named barriers per SM; a kernel using 3 per block fits 21 blocks
    barriers = occupancy(H200, registers=16, threads=32, barriers=3)
    assert barriers.active_blocks_per_sm == 21 and barriers.limiter == "barriers"
    assert occupancy(H200, registers=16, threads=32, barriers=0).block_limits["barriers"] > 10**9


def test_too_many_threads_per_block() -> None:
    result = occupancy(H200, registers=16, threads=1025)
    assert result.active_blocks_per_sm == 0 and "warps" in result.limiters
    assert "maxThreadsPerBlock 1024" in result.explain()


def test_carveout_preference() -> None:
    # half the shared memory (114 KB rounds up to the 132 KB configuration): 2 blocks of 50 KB
    result = occupancy(H200, registers=32, threads=128, dynamic_shared=48 * 1024, carveout=50)
    assert result.shared_per_sm == 132 * 1024 and result.active_blocks_per_sm == 2
    # a preference smaller than one block is ignored for that block
    small = occupancy(H200, registers=32, threads=128, dynamic_shared=48 * 1024, carveout=0)
    assert small.shared_per_sm == 64 * 1024 and small.active_blocks_per_sm == 1


def test_shared_memory_configs() -> None:
    assert shared_memory_configs(9, 0)[-1] == 228 * 1024
    assert [c // 1024 for c in shared_memory_configs(9, 0)] == [
        0, 8, 16, 32, 64, 100, 132, 164, 196, 228
    ]  # fmt: skip
    assert shared_memory_configs(8, 0)[-1] == 164 * 1024
    assert shared_memory_configs(8, 6)[-1] == 100 * 1024
    assert shared_memory_configs(7, 5) == (32 * 1024, 64 * 1024)


# --------------------------------------------------------------------------- device properties


def test_limits_from_the_worker_hello() -> None:
    limits = DeviceLimits.from_properties({**props("sm_90"), "name": "NVIDIA H200"})
    assert limits.max_warps_per_sm == 64 and limits.arch == "sm_90"
    no_reserve = {k: v for k, v in props("sm_90").items() if k != "reservedSharedMemPerBlock"}
    assert DeviceLimits.from_properties(no_reserve).reserved_shared_per_block == 1024
    turing = {k: v for k, v in props("sm_75").items() if k != "reservedSharedMemPerBlock"}
    assert DeviceLimits.from_properties(turing).reserved_shared_per_block == 0


def test_limits_refuse_missing_or_unknown() -> None:
    missing = {k: v for k, v in props("sm_90").items() if k != "regsPerMultiprocessor"}
    with pytest.raises(OccupancyError, match="regsPerMultiprocessor"):
        DeviceLimits.from_properties(missing)
    with pytest.raises(OccupancyError, match=r"compute capability 6\.1"):
        DeviceLimits.from_properties({**props("sm_90"), "major": 6, "minor": 1})
    with pytest.raises(OccupancyError, match="warpSize"):
        DeviceLimits.from_properties({**props("sm_90"), "warpSize": 0})
    with pytest.raises(OccupancyError, match="threads per block"):
        occupancy(H200, registers=32, threads=0)


# --------------------------------------------------------------------------- against the header

HARNESS = r"""
#include <cstdio>
#include <climits>
#include <cuda_occupancy.h>

int main() {
    cudaOccDeviceProp p;
    cudaOccFuncAttributes a;
    cudaOccDeviceState s;
    long long v[18];
    while (true) {
        for (int i = 0; i < 18; ++i) if (scanf("%lld", &v[i]) != 1) return 0;
        p.computeMajor = v[0]; p.computeMinor = v[1]; p.maxThreadsPerBlock = v[2];
        p.maxThreadsPerMultiprocessor = v[3]; p.regsPerBlock = v[4];
        p.regsPerMultiprocessor = v[5]; p.warpSize = v[6]; p.sharedMemPerBlock = v[7];
        p.sharedMemPerMultiprocessor = v[8]; p.sharedMemPerBlockOptin = v[9];
        p.reservedSharedMemPerBlock = v[10]; p.numSms = 100;
        a.maxThreadsPerBlock = INT_MAX; a.numRegs = v[11]; a.sharedSizeBytes = v[12];
        a.partitionedGCConfig = PARTITIONED_GC_OFF; a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
        a.maxDynamicSharedSizeBytes = v[13]; a.numBlockBarriers = v[14];
        a.virtualResourceCount = 0;
        s.carveoutConfig = v[17];
        cudaOccResult r;
        cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, v[15], v[16]);
        if (e != CUDA_OCC_SUCCESS) { printf("error %d\n", (int)e); continue; }
        printf("%d %u %d %d %d %d %d %d %zu\n", r.activeBlocksPerMultiprocessor,
               r.limitingFactors, r.blockLimitWarps, r.blockLimitRegs, r.blockLimitSharedMem,
               r.blockLimitBlocks, r.blockLimitBarriers, r.allocatedRegistersPerBlock,
               r.allocatedSharedMemPerBlock);
    }
}
"""

_BITS = {"warps": 1, "registers": 2, "shared": 4, "blocks": 8, "barriers": 16}


def _random_case(rng: random.Random) -> tuple[str, dict[str, int]]:
    arch = rng.choice(list(DEVICES))
    device = props(arch)
    static = rng.choice([0, 0, rng.randrange(0, 48 * 1024 + 1), rng.randrange(0, 4096)])
    optin = device["sharedMemPerBlockOptin"]
    dynamic = rng.choice([0, rng.randrange(0, optin + 2048), rng.randrange(0, 8192)])
    # the two attribute states a surrotune kernel can be in: opted in, or left at the default
    default_max = max(0, device["sharedMemPerBlock"] - static)
    max_dynamic = rng.choice([default_max, max(dynamic, default_max)])
    case = {
        "registers": rng.choice([rng.randrange(0, 257), rng.randrange(16, 129), 255, 256]),
        "threads": rng.choice([rng.randrange(1, 1100), 32 * rng.randrange(1, 33), 1024]),
        "static_shared": static,
        "dynamic_shared": dynamic,
        "max_dynamic_shared": max_dynamic,
        "barriers": rng.choice([0, 1, 1, rng.randrange(1, 17)]),
        "carveout": rng.choice([-1, -1, -1, rng.randrange(0, 101)]),
    }
    return arch, case


def _header_line(arch: str, case: dict[str, int]) -> str:
    d = props(arch)
    values = [
        d["major"], d["minor"], d["maxThreadsPerBlock"], d["maxThreadsPerMultiProcessor"],
        d["regsPerBlock"], d["regsPerMultiprocessor"], d["warpSize"], d["sharedMemPerBlock"],
        d["sharedMemPerMultiprocessor"], d["sharedMemPerBlockOptin"],
        d["reservedSharedMemPerBlock"], case["registers"], case["static_shared"],
        case["max_dynamic_shared"], case["barriers"], case["threads"], case["dynamic_shared"],
        case["carveout"],
    ]  # fmt: skip
    return " ".join(str(v) for v in values)


@pytest.fixture(scope="module")
def header_calculator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cuda_occupancy.h compiled into a program that answers one launch per input line."""
    directory = tmp_path_factory.mktemp("occupancy")
    (directory / "harness.cpp").write_text(HARNESS)
    binary = directory / "harness"
    built = subprocess.run(
        ["nvcc", "-O1", "-o", str(binary), str(directory / "harness.cpp")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"could not build the cuda_occupancy.h harness:\n{built.stderr}")
    return binary


@pytest.mark.nvcc
def test_port_equals_cuda_occupancy_header(header_calculator: Path) -> None:
    rng = random.Random(20240611)
    cases = [_random_case(rng) for _ in range(4000)]
    answers = subprocess.run(
        [str(header_calculator)], input="\n".join(_header_line(a, c) for a, c in cases) + "\n",
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(answers) == len(cases)
    compared = zero = 0
    for (arch, case), answer in zip(cases, answers, strict=True):
        where = f"{arch} {case}"
        assert not answer.startswith("error"), where  # every case is a valid input
        fields = [int(x) for x in answer.split()]
        active, bits, warps, regs, shared, blocks, barriers, regs_alloc, shared_alloc = fields
        ours = occupancy(DeviceLimits.from_properties(props(arch)), **case)
        assert ours.active_blocks_per_sm == active, where
        limits = ours.block_limits
        assert (limits["warps"], limits["registers"], limits["shared"], limits["blocks"]) == (
            warps, regs, shared, blocks
        ), where  # fmt: skip
        assert limits["barriers"] == barriers, where
        assert ours.registers_per_block == regs_alloc, where
        assert ours.shared_per_block == shared_alloc, where
        # the header keeps the bits set before the barrier limit lowered the result; ours
        # names only the factors equal to the final limit
        header_names = {name for name, bit in _BITS.items() if bits & bit}
        assert set(ours.limiters) <= header_names, where
        if "barriers" not in header_names:
            assert set(ours.limiters) == header_names, where
        compared += 1
        zero += active == 0
    assert compared == len(cases) and 100 < zero < compared - 1000  # both outcomes well covered


def _kwargs(**overrides: Any) -> dict[str, Any]:
    return {"registers": 32, "threads": 256, **overrides}


def test_occupancy_never_grows_with_more_resources() -> None:
    """More registers, threads per block or shared memory never fit more warps."""
    rng = random.Random(7)
    for _ in range(500):
        base = _kwargs(
            registers=rng.randrange(1, 200), threads=32 * rng.randrange(1, 33),
            dynamic_shared=rng.randrange(0, 100_000),
        )  # fmt: skip
        before = occupancy(H200, **base)
        for key, step in (("registers", 8), ("dynamic_shared", 4096)):
            after = occupancy(H200, **{**base, key: base[key] + step})
            assert after.active_blocks_per_sm <= before.active_blocks_per_sm, (base, key)


# --------------------------------------------------------------------------- in the backend


def _resources(registers: int, shared: int = 0, barriers: int = 1) -> KernelResources:
    return KernelResources(
        registers=registers,
        shared_static_bytes=shared,
        local_bytes=0,
        stack_frame_bytes=0,
        spill_store_bytes=0,
        spill_load_bytes=0,
        constant_bytes=0,
        barriers=barriers,
    )


def test_check_limits_refuses_zero_occupancy() -> None:
    """registers x threads fits regsPerBlock, so only the occupancy check catches this launch;
    it is refused as resource before the driver sees it, with the limit named."""
    device = {**props("sm_90"), "maxThreadsDim": [1024, 1024, 64],
              "maxGridSize": [2147483647, 65535, 65535]}  # fmt: skip
    message = check_limits(_resources(80), 800, 0, (1, 1, 1), (800, 1, 1), device)
    assert message is not None and message.startswith("the launch cannot run, no block fits")
    assert "sub-partitions" in message and "regsPerBlock 65536" in message
    assert check_limits(_resources(72), 800, 0, (1, 1, 1), (800, 1, 1), device) is None


def test_kernel_occupancy_fields() -> None:
    device = props("sm_90")
    fields = occupancy_fields(kernel_occupancy(_resources(32, shared=8192), 256, 0, device))
    # 8 KB + 1 KB reserve: 25 blocks by shared memory, 8 by warps and registers
    assert fields == {"occupancy": 1.0, "active_blocks_per_sm": 8,
                      "occupancy_limiter": "warps+registers"}  # fmt: skip
    assert kernel_occupancy(_resources(32), 256, 0, {"name": "unknown"}) is None
    assert occupancy_fields(None) == {}


# --------------------------------------------------------------------------- many at once


def test_the_arrays_equal_the_calculator_launch_for_launch() -> None:
    """``occupancy_arrays`` (the sampler's predicted resources of every candidate) is
    :func:`occupancy` per launch, fractional predictions rounded as the compiler would count
    (registers up, threads and bytes to the nearest), launches that cannot run at 0."""
    rng = np.random.default_rng(0)
    n = 2000
    registers = rng.uniform(0, 300, n)
    threads = rng.choice([32, 64, 96, 128, 256, 384, 512, 768, 1024, 2048], n).astype(float)
    threads += rng.uniform(-0.4, 0.4, n)
    shared = rng.choice([0, 1000, 16640, 49152, 100_000, 240_000], n) + rng.uniform(0, 0.4, n)
    fraction, blocks = occupancy_arrays(H200, registers, threads, shared)
    for k in range(n):
        one = occupancy(H200, registers=math.ceil(registers[k]), threads=round(threads[k]),
                        static_shared=round(shared[k]))  # fmt: skip
        assert fraction[k] == one.fraction and blocks[k] == one.active_blocks_per_sm
    assert (blocks == 0).any() and (fraction == 1.0).any()


def test_a_trials_device_limits_give_the_same_calculator() -> None:
    """The sampler reads the device from the ``device_limits`` trial attribute, which keeps the
    fields under surrotune's names."""
    hello = {**props("sm_90"), "name": "NVIDIA H200", "multiProcessorCount": 132}
    assert DeviceLimits.from_limits(device_limits(hello)) == H200
    with pytest.raises(OccupancyError, match="lack"):
        DeviceLimits.from_limits({"max_threads_per_block": 1024})
