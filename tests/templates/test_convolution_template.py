"""templates/convolution.cu: its declared search space, its failure regions under nvcc, its
float64 reference, and (on a GPU) its results against that reference for image sizes that are
multiples of nothing, non-square filters and misaligned pointers."""

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
from surrotune.experiment import load_experiment
from surrotune.template import Template
from tests.templates.template_support import (
    assert_in_declared_space,
    declared_space,
    feasible,
    load_reference,
)

REPO = Path(__file__).resolve().parents[2]
CONVOLUTION = REPO / "templates" / "convolution.cu"
EXPERIMENT = REPO / "experiments" / "convolution.toml"
REFERENCE = REPO / "experiments" / "convolution_reference.py"
NAMES = (
    "BLOCK_X",
    "BLOCK_Y",
    "TILE_X",
    "TILE_Y",
    "VEC",
    "USE_SHARED",
    "PAD",
    "READ_ONLY",
    "FILTER_SHARED",
)
SIZES = ("FW", "FH")  # problem sizes rendered into the template
STATIC_SHARED_LIMIT = 48 * 1024
REGISTERS_PER_BLOCK = 65536
DEFAULT_FILTER = {"FW": 17, "FH": 17}


def config(*values: int) -> dict[str, int]:
    return dict(zip(NAMES, values, strict=True))


def threads(c: Mapping[str, int]) -> int:
    return c["BLOCK_X"] * c["BLOCK_Y"]


def round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def shared_bytes(c: Mapping[str, int], fw: int = 17, fh: int = 17) -> int:
    """Static shared memory as the header documents it: the padded input tile, the filter."""
    tile = (c["BLOCK_Y"] * c["TILE_Y"] + fh - 1) * (
        round_up(c["BLOCK_X"] * c["TILE_X"] + fw - 1, 4) + c["PAD"]
    )
    return 4 * (c["USE_SHARED"] * tile + c["FILTER_SHARED"] * fh * round_up(fw, 4))


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_file(CONVOLUTION)


def test_every_parameter_is_a_placeholder(template: Template) -> None:
    params, _, _ = declared_space(template.text)
    assert tuple(params) == NAMES
    assert template.placeholders == frozenset(NAMES) | frozenset(SIZES)


def test_experiment_declares_the_header_space() -> None:
    """The experiment file and the template's header describe the same space."""
    params, constraints, _ = declared_space(CONVOLUTION.read_text())
    experiment = load_experiment(EXPERIMENT)
    assert {name: list(values) for name, values in experiment.parameters.items()} == params
    assert [str(c) for c in experiment.constraints] == constraints
    assert {name: experiment.sizes[name] for name in SIZES} == DEFAULT_FILTER
    # the default working set (padded input and output) is well over the H200's 60 MB L2
    w, h = experiment.sizes["W"], experiment.sizes["H"]
    assert 4 * ((w + 16) * (h + 16) + w * h) > 2 * 60e6


def test_declared_space_size_matches_the_constraints(template: Template) -> None:
    params, constraints, (count, total) = declared_space(template.text)
    assert total == int(np.prod([len(v) for v in params.values()]))
    space = feasible(params, constraints)
    assert len(space["VEC"]) == count
    assert 1000 <= count <= 8000
    for name, values in params.items():  # no dead values
        assert set(np.unique(space[name]).tolist()) == set(values), name
    configs = [dict(zip(space, row, strict=True)) for row in zip(*space.values(), strict=True)]
    # the failure regions stay inside the space: a share of it needs more than 48 KB of shared
    over = sum(shared_bytes(c) > STATIC_SHARED_LIMIT for c in configs)
    assert over == 1360  # as the header says
    assert 0.1 * count < over < 0.5 * count
    assert all(64 <= threads(c) <= 1024 for c in configs)


#: (config, what nvcc must say) — the edges of the space and its failure regions
SAMPLES: list[tuple[dict[str, int], str]] = [
    (config(16, 4, 1, 1, 1, 0, 0, 0, 0), "ok"),  # smallest everything: global, scalar
    (config(32, 4, 4, 4, 4, 1, 0, 1, 1), "ok"),  # shared tile and filter, float4, __ldg
    (config(64, 16, 1, 1, 1, 1, 0, 1, 0), "ok"),  # 1024 threads, within the register file
    (config(16, 16, 4, 8, 4, 1, 1, 1, 1), "compiles"),  # 48016 B: the most shared under 48 KB
    (config(64, 2, 8, 4, 4, 1, 0, 1, 0), "resource"),  # 50688 B: the least shared over 48 KB
    (config(128, 8, 8, 8, 4, 0, 0, 1, 1), "too many registers"),  # compiles, cannot launch
    (config(128, 8, 8, 8, 4, 1, 0, 1, 1), "resource"),  # largest tile: 333 KB shared
]


@pytest.fixture(scope="module")
def compiled(template: Template) -> list[CompiledKernel | CompileError]:
    requests = [
        CompileRequest(
            template.render({**c, **DEFAULT_FILTER}), "convolution", arch="sm_90", options=("-O3",)
        )
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
    if expected == "too many registers":
        assert needed > REGISTERS_PER_BLOCK
    elif expected == "ok":
        assert needed <= REGISTERS_PER_BLOCK
        assert resources.spill_store_bytes == 0


@pytest.mark.nvcc
def test_a_config_outside_the_space_fails_to_compile(template: Template) -> None:
    """The static_asserts catch what the constraints exclude, as a compile (not resource) error."""
    with pytest.raises(CompileError) as info:
        source = template.render({**config(32, 4, 2, 2, 4, 1, 0, 0, 0), **DEFAULT_FILTER})
        compile_kernel(CompileRequest(source, "convolution"))
    assert not info.value.is_resource
    assert "VEC must divide TILE_X" in info.value.message


def direct(image: np.ndarray, kernel: np.ndarray, h: int, w: int) -> np.ndarray:
    """The definition, summed term by term in float64."""
    fh, fw = kernel.shape
    out = np.zeros((h, w))
    for i in range(fh):
        for j in range(fw):
            out += image[i : i + h, j : j + w].astype(np.float64) * float(kernel[i, j])
    return out


@pytest.mark.parametrize(("w", "h", "fw", "fh"), [(9, 7, 3, 5), (16, 1, 1, 1), (13, 11, 17, 17)])
def test_reference_is_the_float64_correlation(w: int, h: int, fw: int, fh: int) -> None:
    rng = np.random.default_rng(w * h)
    image = rng.uniform(-1, 1, (h + fh - 1, w + fw - 1)).astype(np.float32)
    kernel = rng.uniform(-1, 1, (fh, fw)).astype(np.float32)
    out = load_reference(REFERENCE)(
        input=image, filter=kernel, output=np.zeros((h, w), np.float32), W=np.int32(w), H=h
    )["output"]
    assert out.dtype == np.float64
    assert out.shape == (h, w)
    np.testing.assert_allclose(out, direct(image, kernel, h, w), rtol=0, atol=1e-12)
    # a correlation, not a convolution: one tap lands on the input shifted by its position
    kernel = np.zeros_like(kernel)
    kernel[fh - 1, 0] = 1
    shifted = load_reference(REFERENCE)(input=image, filter=kernel, output=out, W=w, H=h)["output"]
    np.testing.assert_allclose(shifted, image[fh - 1 : fh - 1 + h, :w], atol=1e-12)


GPU_CONFIGS = [
    config(32, 4, 4, 4, 4, 1, 0, 1, 1),  # shared tile and filter, float4
    config(16, 4, 8, 2, 4, 0, 0, 1, 0),  # global segments, float4, partial thread tiles
    config(16, 4, 1, 1, 1, 0, 0, 0, 0),  # the smallest: global, scalar, plain loads
    config(16, 8, 2, 8, 2, 1, 1, 0, 0),  # padded shared rows (scalar shared reads), float2
    config(64, 16, 1, 1, 1, 1, 0, 1, 0),  # 1024 threads
    config(16, 16, 4, 8, 4, 1, 1, 1, 1),  # the largest shared tile under 48 KB
]
#: (W, H, FW, FH, offset): an odd row length (scalar fallback, partial tiles), one that allows
#: float4 but no whole tile, a small non-square filter, and pointers one float off alignment
GPU_SHAPES = [
    (257, 129, 17, 17, 0),
    (300, 72, 17, 17, 0),
    (100, 50, 5, 3, 0),
    (300, 72, 17, 17, 1),
]


@pytest.fixture(scope="module")
def kernels(template: Template, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    """Compiled CuPy functions by (config index, FW, FH), compiled once."""
    import cupy

    cache: dict[Any, Any] = {}
    folder = tmp_path_factory.mktemp("convolution")

    def get(index: int, fw: int, fh: int) -> Any:
        key = (index, fw, fh)
        if key not in cache:
            source = template.render({**GPU_CONFIGS[index], "FW": fw, "FH": fh})
            kernel = compile_kernel(CompileRequest(source, "convolution", arch="sm_90"))
            cubin = folder / f"convolution_{index}_{fw}_{fh}.cubin"
            cubin.write_bytes(kernel.cubin)
            cache[key] = cupy.RawModule(path=str(cubin)).get_function("convolution")
        return cache[key]

    return {"get": get}


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("index", range(len(GPU_CONFIGS)))
def test_convolution_matches_numpy(
    kernels: dict[str, Any], index: int, shape: tuple[int, int, int, int, int]
) -> None:
    import cupy

    c = GPU_CONFIGS[index]
    w, h, fw, fh, offset = shape
    convolution = kernels["get"](index, fw, fh)

    rng = np.random.default_rng(index)
    image = rng.uniform(-1, 1, (h + fh - 1, w + fw - 1)).astype(np.float32)
    kernel = rng.uniform(-1, 1, (fh, fw)).astype(np.float32)
    # offset > 0: the input and output start that many floats past a 256-byte boundary
    d_image = cupy.empty(image.size + offset, dtype=cupy.float32)[offset:]
    d_image[...] = cupy.asarray(image.ravel())
    d_kernel = cupy.asarray(kernel)
    d_out = cupy.full(w * h + offset, np.nan, dtype=cupy.float32)[offset:]  # all must be written
    grid = (-(-w // (c["BLOCK_X"] * c["TILE_X"])), -(-h // (c["BLOCK_Y"] * c["TILE_Y"])))
    block = (c["BLOCK_X"], c["BLOCK_Y"])
    convolution(grid, block, (d_image, d_kernel, d_out, np.int32(w), np.int32(h)))
    cupy.cuda.runtime.deviceSynchronize()

    expected = load_reference(REFERENCE)(
        input=image, filter=kernel, output=np.empty((h, w), np.float32), W=w, H=h
    )["output"]
    result = cupy.asnumpy(d_out).reshape(h, w).astype(np.float64)
    assert np.isfinite(result).all(), f"unwritten outputs for {c} on {shape}"
    error = np.linalg.norm(result - expected) / np.linalg.norm(expected)
    assert error < 1e-5, f"relative L2 error {error:.3g} for {c} on {shape}"
