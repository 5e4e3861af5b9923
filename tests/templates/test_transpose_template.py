"""templates/transpose.cu: its declared search space, its failure regions under nvcc, and (on a
GPU) its results against NumPy for shapes and alignments that are multiples of nothing."""

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
TEMPLATE = REPO / "templates" / "transpose.cu"
EXPERIMENT = REPO / "experiments" / "transpose.toml"
REFERENCE = REPO / "experiments" / "transpose_reference.py"
NAMES = ("TILE_DIM", "BLOCK_ROWS", "VEC", "SHARED", "PAD", "DIAGONAL", "TILES_PER_BLOCK")
STATIC_SHARED_LIMIT = 48 * 1024
REGISTERS_PER_BLOCK = 65536
MAX_THREADS = 1024


def config(*values: int) -> dict[str, int]:
    return dict(zip(NAMES, values, strict=True))


def block(c: Mapping[str, int]) -> tuple[int, int]:
    return c["TILE_DIM"] // c["VEC"], c["BLOCK_ROWS"]


def threads(c: Mapping[str, int]) -> int:
    x, y = block(c)
    return x * y


def grid(c: Mapping[str, int], rows: int, cols: int) -> tuple[int, int]:
    return -(-cols // (c["TILE_DIM"] * c["TILES_PER_BLOCK"])), -(-rows // c["TILE_DIM"])


def shared_bytes(c: Mapping[str, int]) -> int:
    """Static shared memory as the header documents it: one padded tile, or none."""
    return 4 * c["TILE_DIM"] * (c["TILE_DIM"] + c["PAD"]) if c["SHARED"] else 0


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
    # the failure regions stay inside the space, as many as the header says
    over = [shared_bytes(c) > STATIC_SHARED_LIMIT for c in configs]
    wide = [threads(c) > MAX_THREADS for c in configs]
    both = sum(o and w for o, w in zip(over, wide, strict=True))
    assert (sum(over), sum(wide), both) == (216, 72, 36)
    assert "216 of the 1458 configurations exceed 48 KB, 72 exceed 1024 threads" in template.text


def test_the_default_size_streams_from_dram(experiment: Experiment) -> None:
    rows, cols = int(experiment.sizes["ROWS"]), int(experiment.sizes["COLS"])
    assert 8 * rows * cols > 4 * 60 * 10**6  # in and out are several times the 60 MB L2
    out = next(arg for arg in experiment.arguments if arg.name == "B")
    assert out.output and out.fill != "zeros"  # poisoned: every element must be written


@pytest.mark.parametrize(
    "c",
    [config(32, 8, 4, 1, 1, 0, 1), config(8, 1, 1, 0, 0, 1, 4), config(128, 32, 1, 0, 0, 0, 2)],
)
def test_launch_geometry(experiment: Experiment, c: dict[str, int]) -> None:
    geometry = launch_geometry(experiment.launch, {**experiment.sizes, **c})
    rows, cols = int(experiment.sizes["ROWS"]), int(experiment.sizes["COLS"])
    assert geometry.grid == (*grid(c, rows, cols), 1)
    assert geometry.block == (*block(c), 1)
    assert geometry.dynamic_shared_bytes == 0


#: (config, what nvcc must say) — the edges of the space and its failure regions
SAMPLES: list[tuple[dict[str, int], str]] = [
    (config(8, 1, 1, 0, 0, 0, 1), "ok"),  # smallest: 8 threads, direct stores
    (config(32, 8, 4, 1, 1, 1, 2), "ok"),  # float4 both sides, padded tile, diagonal order
    (config(64, 16, 2, 1, 0, 0, 4), "ok"),  # float2, unpadded 16 KB tile, 1024 threads
    (config(64, 1, 1, 1, 1, 1, 1), "ok"),  # 64 loads per thread through a padded tile
    (config(128, 8, 1, 0, 0, 1, 4), "too many registers"),  # compiles, cannot launch
    (config(128, 32, 1, 0, 0, 0, 1), "too many threads"),  # 4096 threads: cannot launch
    (config(128, 8, 4, 1, 1, 0, 1), "resource"),  # 66 KB tile
]


@pytest.fixture(scope="module")
def compiled(template: Template, experiment: Experiment) -> list[CompiledKernel | CompileError]:
    assert experiment.kernel is not None
    requests = [
        CompileRequest(template.render(c), "transpose", "sm_90", experiment.kernel.options)
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
    needed = resources.registers * threads(c)
    if expected == "too many threads":
        assert threads(c) > MAX_THREADS
    elif expected == "too many registers":
        assert threads(c) <= MAX_THREADS
        assert needed > REGISTERS_PER_BLOCK
    else:
        assert threads(c) <= MAX_THREADS
        assert needed <= REGISTERS_PER_BLOCK
        assert resources.spill_store_bytes == 0


@pytest.mark.nvcc
def test_a_config_outside_the_space_fails_to_compile(template: Template) -> None:
    """The static_asserts catch what the constraints exclude, as a compile (not resource) error."""
    with pytest.raises(CompileError) as info:
        compile_kernel(CompileRequest(template.render(config(32, 8, 4, 0, 1, 0, 1)), "transpose"))
    assert not info.value.is_resource
    assert "PAD only pads a shared tile" in info.value.message


def test_reference_is_the_transpose() -> None:
    a = np.arange(15, dtype=np.float32).reshape(3, 5)
    out = load_reference(REFERENCE)(A=a, B=np.empty((5, 3), np.float32), rows=3, cols=5)["B"]
    assert out.shape == (5, 3)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, a.T)


GPU_CONFIGS = [
    config(32, 8, 4, 1, 1, 0, 1),  # the classic tile, float4 on both sides
    config(64, 16, 2, 1, 0, 1, 2),  # unpadded, diagonal, two tiles per block
    config(16, 2, 4, 1, 1, 1, 4),  # 8 threads wide, four tiles per block
    config(8, 8, 1, 1, 1, 0, 1),  # smallest tile through shared memory
    config(32, 4, 4, 0, 0, 1, 2),  # direct, float4 loads, diagonal
    config(128, 32, 4, 0, 0, 0, 4),  # direct, largest tile, 1024 threads
]
#: (rows, cols): odd sizes (scalar fallback, partial tiles in both directions), sizes that allow
#: float4 but are not whole tiles, whole tiles, one row and one column
GPU_SHAPES = [(257, 129), (200, 136), (512, 256), (1, 77), (77, 1)]


@pytest.fixture(scope="module")
def kernels(template: Template, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    import cupy

    directory = tmp_path_factory.mktemp("transpose")
    requests = [CompileRequest(template.render(c), "transpose", "sm_90") for c in GPU_CONFIGS]
    functions = []
    for index, outcome in enumerate(compile_many(requests)):
        assert isinstance(outcome, CompiledKernel), getattr(outcome, "message", "")
        path = directory / f"transpose_{index}.cubin"
        path.write_bytes(outcome.cubin)
        functions.append(cupy.RawModule(path=str(path)).get_function("transpose"))
    return functions


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("index", range(len(GPU_CONFIGS)))
def test_transpose_matches_numpy(kernels: list[Any], index: int) -> None:
    """Every element exact; nothing written outside `out` (a NaN guard on both sides); and the
    same with `in` and `out` one float off their alignment (the scalar fallback)."""
    import cupy

    c = GPU_CONFIGS[index]
    rng = np.random.default_rng(index)
    guard = 64
    for rows, cols in GPU_SHAPES:
        for in_offset, out_offset in ((0, 0), (1, 1)):
            a = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)
            d_in = cupy.zeros(rows * cols + in_offset, dtype=cupy.float32)
            d_in[in_offset:] = cupy.asarray(a.ravel())
            d_out = cupy.full(rows * cols + out_offset + 2 * guard, np.nan, dtype=cupy.float32)
            start = guard + out_offset
            view = d_out[start : start + rows * cols]
            kernels[index](
                grid(c, rows, cols),
                block(c),
                (d_in[in_offset:], view, np.int32(rows), np.int32(cols)),
            )
            cupy.cuda.runtime.deviceSynchronize()
            result = cupy.asnumpy(d_out)
            where = f"{c} on {rows} x {cols}, offsets {in_offset}, {out_offset}"
            assert np.isnan(result[:start]).all(), f"written before out: {where}"
            assert np.isnan(result[start + rows * cols :]).all(), f"written after out: {where}"
            expected = load_reference(REFERENCE)(
                A=a, B=np.empty((cols, rows), np.float32), rows=rows, cols=cols
            )
            np.testing.assert_array_equal(
                result[start : start + rows * cols].reshape(cols, rows), expected["B"], where
            )
