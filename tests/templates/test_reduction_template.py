"""templates/reduction.cu: its declared search space, its failure regions under nvcc, and (on a
GPU) its sums against NumPy for sizes and alignments that are multiples of nothing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    compile_kernel,
    compile_many,
)
from surrotune.backends.cuda import launch_geometry
from surrotune.experiment import Experiment, load_experiment
from surrotune.space import SearchSpace
from surrotune.template import Template
from tests.templates.template_support import (
    assert_in_declared_space,
    declared_space,
    load_reference,
)

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "reduction.cu"
EXPERIMENT = REPO / "experiments" / "reduction.toml"
REFERENCE = REPO / "experiments" / "reduction_reference.py"
NAMES = ("BLOCK_SIZE", "ITEMS_PER_THREAD", "VEC", "STAGE", "REDUCE", "BLOCKS_PER_SM")
STATIC_SHARED_LIMIT = 48 * 1024
REGISTERS_PER_BLOCK = 65536
SMS = 132  # the H200's, as the experiment's [sizes] says


def config(*values: int) -> dict[str, int]:
    return dict(zip(NAMES, values, strict=True))


def chunk_floats(c: Mapping[str, int]) -> int:
    """Floats one block reduces per chunk (and the one-pass grid's divisor)."""
    return c["BLOCK_SIZE"] * c["ITEMS_PER_THREAD"] * c["VEC"]


def shared_bytes(c: Mapping[str, int]) -> int:
    """Static shared memory as the template declares it: the cp.async staging buffer, plus the
    shared tree (one float per thread) or the warps' sums (one float per warp, none for one)."""
    staging = 4 * chunk_floats(c) if c["STAGE"] else 0
    warps = c["BLOCK_SIZE"] // 32
    reduce = 4 * c["BLOCK_SIZE"] if c["REDUCE"] == 1 else (4 * warps if warps > 1 else 0)
    return staging + reduce


def grid_size(c: Mapping[str, int], n: int) -> int:
    return -(-n // chunk_floats(c)) if c["BLOCKS_PER_SM"] == 0 else SMS * c["BLOCKS_PER_SM"]


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_file(TEMPLATE)


@pytest.fixture(scope="module")
def experiment() -> Experiment:
    return load_experiment(EXPERIMENT)


def test_every_parameter_is_a_placeholder(template: Template) -> None:
    params, _, _ = declared_space(template.text)
    assert tuple(params) == NAMES
    assert template.placeholders == frozenset(NAMES)


def test_header_and_experiment_declare_the_same_space(
    template: Template, experiment: Experiment
) -> None:
    params, constraints, (count, total) = declared_space(template.text)
    assert {name: list(values) for name, values in experiment.parameters.items()} == params
    assert [str(c) for c in experiment.constraints] == constraints
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    assert space.product_size == total
    frame = space.enumerate()
    assert len(frame) == count
    assert count >= 1000
    for name, values in params.items():  # no dead values
        assert set(frame[name].unique().tolist()) == set(values), name
    configs = frame.to_dict("records")
    # the failure regions stay inside the space: staging buffers over 48 KB (180, as the header
    # says) and 1024 threads with 64 floats in registers (registers * threads > 65536)
    over = sum(shared_bytes(c) > STATIC_SHARED_LIMIT for c in configs)
    assert over == 180
    heavy = sum(
        c["STAGE"] == 0 and c["BLOCK_SIZE"] == 1024 and c["ITEMS_PER_THREAD"] * c["VEC"] == 64
        for c in configs
    )
    assert heavy == 24
    assert "(180 of the 2448 configurations)" in template.text


def test_the_default_size_streams_from_dram(experiment: Experiment) -> None:
    n = int(experiment.sizes["N"])
    assert n >= 1 << 26
    assert 4 * n > 4 * 60 * 10**6  # the input is several times the H200's 60 MB L2
    assert experiment.sizes["SMS"] == SMS
    out = next(arg for arg in experiment.arguments if arg.name == "out")
    assert out.output and out.fill == "zeros"  # atomics accumulate into it


@pytest.mark.parametrize(
    "c",
    [config(32, 1, 1, 0, 0, 0), config(256, 4, 4, 1, 1, 0), config(1024, 2, 2, 0, 0, 8)],
)
def test_launch_geometry_is_one_pass_or_grid_stride(
    experiment: Experiment, c: dict[str, int]
) -> None:
    geometry = launch_geometry(experiment.launch, {**experiment.sizes, **c})
    n = int(experiment.sizes["N"])
    assert geometry.grid == (grid_size(c, n), 1, 1)
    assert geometry.block == (c["BLOCK_SIZE"], 1, 1)
    assert geometry.dynamic_shared_bytes == 0
    if c["BLOCKS_PER_SM"] == 0:  # one pass: one chunk per block, the grid covers the array
        assert geometry.grid[0] * chunk_floats(c) >= n


#: (config, what nvcc must say) — the edges of the space and its failure regions
SAMPLES: list[tuple[dict[str, int], str]] = [
    (config(32, 1, 1, 0, 0, 0), "ok"),  # smallest: one warp, scalar loads, one pass
    (config(256, 4, 4, 0, 0, 4), "ok"),  # float4 in registers, grid-stride, shuffles
    (config(1024, 8, 4, 0, 1, 16), "ok"),  # 1024 threads, 32 floats each, shared tree
    (config(64, 32, 2, 1, 1, 0), "ok"),  # cp.async of 8 bytes, 16 KB staging
    (config(256, 8, 4, 1, 0, 2), "ok"),  # cp.async of 16 bytes, 32 KB staging
    (config(1024, 16, 4, 0, 0, 1), "too many registers"),  # compiles, cannot launch
    (config(512, 16, 4, 1, 1, 0), "resource"),  # 128 KB of staging
]


@pytest.fixture(scope="module")
def compiled(template: Template, experiment: Experiment) -> list[CompiledKernel | CompileError]:
    assert experiment.kernel is not None
    requests = [
        CompileRequest(template.render(c), "reduction", "sm_90", experiment.kernel.options)
        for c, _ in SAMPLES
    ]
    return compile_many(requests)


@pytest.mark.nvcc
def test_samples_are_in_the_declared_space(template: Template) -> None:
    _, constraints, _ = declared_space(template.text)
    assert_in_declared_space(
        (c for c, _ in [*SAMPLES, *((g, "gpu") for g in GPU_CONFIGS)]), constraints
    )


@pytest.mark.nvcc
@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_sample_compiles_as_expected(
    compiled: list[CompiledKernel | CompileError], index: int
) -> None:
    c, expected = SAMPLES[index]
    outcome = compiled[index]
    if expected == "resource":
        assert isinstance(outcome, CompileError)
        assert outcome.is_resource, outcome.message
        assert "too much shared data" in outcome.message
        assert shared_bytes(c) > STATIC_SHARED_LIMIT
        return
    assert isinstance(outcome, CompiledKernel), getattr(outcome, "message", "")
    resources = outcome.resources
    assert resources.shared_static_bytes == shared_bytes(c)
    assert resources.max_threads_per_block is None  # no __launch_bounds__, on purpose
    needed = resources.registers * c["BLOCK_SIZE"]
    if expected == "too many registers":
        assert needed > REGISTERS_PER_BLOCK
    else:
        assert needed <= REGISTERS_PER_BLOCK
        assert resources.spill_store_bytes == 0


@pytest.mark.nvcc
def test_a_config_outside_the_space_fails_to_compile(template: Template) -> None:
    """The static_asserts catch what the constraints exclude, as a compile (not resource) error."""
    with pytest.raises(CompileError) as info:
        compile_kernel(CompileRequest(template.render(config(256, 32, 4, 0, 0, 0)), "reduction"))
    assert not info.value.is_resource
    assert "at most 64 floats per thread and chunk" in info.value.message


def test_reference_is_the_float64_sum() -> None:
    x = np.array([1e8, 1.0, -1e8, 0.5], dtype=np.float32)  # float32 sums would lose the 1.0
    out = load_reference(REFERENCE)(x=x, out=np.zeros(1, np.float32), n=4)
    assert out["out"].dtype == np.float64
    assert out["out"].shape == (1,)
    assert out["out"][0] == 1.5


GPU_CONFIGS = [
    config(32, 1, 1, 0, 0, 0),  # one pass, the finest grid, one warp: no shared memory at all
    config(256, 4, 4, 0, 0, 4),  # grid-stride, float4 in registers, shuffles
    config(128, 8, 4, 1, 1, 0),  # one pass, cp.async of 16 bytes, shared tree
    config(512, 2, 2, 1, 0, 16),  # grid-stride, cp.async of 8 bytes, more blocks than chunks
    config(64, 32, 1, 0, 1, 1),  # grid-stride, one block per SM, 32 scalar loads, shared tree
    config(1024, 4, 1, 1, 0, 2),  # grid-stride, cp.async of 4 bytes, 1024 threads
]
#: sizes below a vector, a prime, a power of two (whole chunks): with the offsets below, every
#: case of head, partial chunk and tail
GPU_SIZES = [1, 5, 1 << 20, 1_000_003]
#: elements skipped before x starts: 0 (aligned) and 1 (misaligned for float2 and float4 loads)
GPU_OFFSETS = [0, 1]


@pytest.fixture(scope="module")
def kernels(template: Template, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    import cupy

    directory = tmp_path_factory.mktemp("reduction")
    requests = [CompileRequest(template.render(c), "reduction", "sm_90") for c in GPU_CONFIGS]
    functions = []
    for index, outcome in enumerate(compile_many(requests)):
        assert isinstance(outcome, CompiledKernel), getattr(outcome, "message", "")
        path = directory / f"reduction_{index}.cubin"
        path.write_bytes(outcome.cubin)
        functions.append(cupy.RawModule(path=str(path)).get_function("reduction"))
    return functions


def run_sum(kernel: Any, c: Mapping[str, int], d_x: Any, n: int) -> float:
    import cupy

    d_out = cupy.zeros(1, dtype=cupy.float32)  # what fill = "zeros" gives the kernel
    kernel((grid_size(c, n),), (c["BLOCK_SIZE"],), (d_x, d_out, np.int32(n)))
    cupy.cuda.runtime.deviceSynchronize()
    return float(cupy.asnumpy(d_out)[0])


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("index", range(len(GPU_CONFIGS)))
def test_reduction_is_exact_on_small_integers(kernels: list[Any], index: int) -> None:
    """Integers in [-8, 8) sum exactly in float32 up to 2^24 in magnitude, in any order: so every
    element lost, added twice or read from the wrong place shows, whatever the rounding."""
    import cupy

    c = GPU_CONFIGS[index]
    rng = np.random.default_rng(index)
    for n in GPU_SIZES:
        for offset in GPU_OFFSETS:
            host = rng.integers(-8, 8, n + offset).astype(np.float32)
            d_base = cupy.asarray(host)
            result = run_sum(kernels[index], c, d_base[offset:], n)
            expected = int(host[offset:].astype(np.int64).sum())
            assert result == expected, f"{c}, n = {n}, offset = {offset}: {result} != {expected}"


@pytest.mark.gpu
@pytest.mark.nvcc
def test_reduction_matches_numpy_at_the_default_size(
    kernels: list[Any], experiment: Experiment
) -> None:
    """The tuner's own check: its inputs (seed 0), its reference and its rtol."""
    import cupy

    from surrotune.backends.worker import create_inputs, relative_l2_error

    assert experiment.reference is not None
    host = create_inputs(experiment.arguments, experiment.sizes, seed=0)
    n = int(host["n"])
    expected = load_reference(REFERENCE)(**{k: v for k, v in host.items()})["out"]
    d_x = cupy.asarray(host["x"])
    for index, c in enumerate(GPU_CONFIGS):
        result = np.array([run_sum(kernels[index], c, d_x, n)])
        error = relative_l2_error(result, expected)
        assert error <= experiment.reference.rtol, f"relative error {error:.3g} for {c}"
