"""templates/gemm.cu: its declared search space, its failure regions under nvcc, and (on a GPU)
its results against NumPy for shapes that are multiples of nothing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    compile_kernel,
    compile_many,
)
from surrotune.template import Template
from tests.templates.template_support import (
    assert_in_declared_space,
    declared_space,
    feasible,
    load_reference,
)

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "templates" / "gemm.cu"
REFERENCE = REPO / "experiments" / "gemm_reference.py"
NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "TM", "TN", "VEC", "PAD", "UNROLL", "DOUBLE_BUFFER")
STATIC_SHARED_LIMIT = 48 * 1024
REGISTERS_PER_BLOCK = 65536


def config(*values: int) -> dict[str, int]:
    return dict(zip(NAMES, values, strict=True))


def threads(c: Mapping[str, int]) -> int:
    return (c["BLOCK_M"] // c["TM"]) * (c["BLOCK_N"] // c["TN"])


def shared_bytes(c: Mapping[str, int]) -> int:
    """Static shared memory as the header documents it: two tiles, padded, per stage."""
    stages = 1 + c["DOUBLE_BUFFER"]
    return 4 * stages * c["BLOCK_K"] * (c["BLOCK_M"] + c["BLOCK_N"] + 2 * c["PAD"])


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_file(GEMM)


def test_every_parameter_is_a_placeholder(template: Template) -> None:
    params, _, _ = declared_space(template.text)
    assert tuple(params) == NAMES
    assert template.placeholders == frozenset(NAMES)


def test_declared_space_size_matches_the_constraints(template: Template) -> None:
    params, constraints, (count, total) = declared_space(template.text)
    assert total == int(np.prod([len(v) for v in params.values()]))
    space = feasible(params, constraints)
    assert len(space["TM"]) == count
    assert 2000 <= count <= 8000
    for name, values in params.items():  # no dead values
        assert set(np.unique(space[name]).tolist()) == set(values), name
    configs = [dict(zip(space, row, strict=True)) for row in zip(*space.values(), strict=True)]
    # the failure regions stay inside the space: a share of it needs more than 48 KB of shared
    over = sum(shared_bytes(c) > STATIC_SHARED_LIMIT for c in configs)
    assert 0.1 * count < over < 0.5 * count
    assert all(128 <= threads(c) <= 1024 for c in configs)


#: (config, what nvcc must say) — the edges of the space and its failure regions
SAMPLES: list[tuple[dict[str, int], str]] = [
    (config(16, 32, 8, 2, 2, 1, 0, 1, 0), "ok"),  # smallest tile, scalar loads, no unrolling
    (config(128, 128, 8, 8, 8, 4, 4, 0, 1), "ok"),  # float4, padded, double-buffered
    (config(64, 64, 16, 4, 4, 2, 1, 0, 0), "ok"),  # float2 loads, odd padding
    (config(256, 128, 16, 8, 8, 4, 0, 0, 1), "compiles"),  # exactly 48 KB of shared memory
    (config(256, 256, 16, 8, 8, 4, 0, 0, 0), "too many registers"),  # compiles, cannot launch
    (config(256, 256, 64, 16, 8, 4, 4, 0, 1), "resource"),  # largest tile: 260 KB shared
]


@pytest.fixture(scope="module")
def compiled(template: Template) -> list[CompiledKernel | CompileError]:
    requests = [CompileRequest(template.render(c), "gemm", arch="sm_90") for c, _ in SAMPLES]
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
        compile_kernel(
            CompileRequest(template.render(config(64, 64, 8, 3, 4, 4, 0, 0, 0)), "gemm")
        )
    assert not info.value.is_resource
    assert "thread tile must divide the block" in info.value.message


def test_reference_is_the_float64_product() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    out = load_reference(REFERENCE)(A=a, B=b, C=np.zeros((5, 4), np.float32), M=5, N=4, K=3)
    assert out["C"].dtype == np.float64
    np.testing.assert_allclose(out["C"], a.astype(np.float64) @ b.astype(np.float64))


GPU_CONFIGS = [
    config(128, 128, 8, 8, 8, 4, 4, 0, 1),
    config(64, 32, 16, 4, 2, 2, 1, 1, 0),
    config(16, 32, 8, 2, 2, 1, 0, 0, 0),
]
#: (M, N, K): odd sizes (scalar fallback, partial tiles) and sizes that allow float4 but not tiles
GPU_SHAPES = [(257, 129, 67), (200, 136, 72)]


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("index", range(len(GPU_CONFIGS)))
def test_gemm_matches_numpy(
    template: Template, tmp_path: Path, index: int, shape: tuple[int, int, int]
) -> None:
    import cupy

    c = GPU_CONFIGS[index]
    kernel = compile_kernel(CompileRequest(template.render(c), "gemm", arch="sm_90"))
    cubin = tmp_path / "gemm.cubin"
    cubin.write_bytes(kernel.cubin)
    gemm = cupy.RawModule(path=str(cubin)).get_function("gemm")

    m, n, k = shape
    rng = np.random.default_rng(index)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    d_a, d_b = cupy.asarray(a), cupy.asarray(b)
    d_c = cupy.full((m, n), np.nan, dtype=cupy.float32)  # every element must be written
    grid = (-(-n // c["BLOCK_N"]), -(-m // c["BLOCK_M"]))
    gemm(grid, (threads(c),), (d_a, d_b, d_c, np.int32(m), np.int32(n), np.int32(k)))
    cupy.cuda.runtime.deviceSynchronize()

    expected = load_reference(REFERENCE)(A=a, B=b, C=np.empty((m, n), np.float32), M=m, N=n, K=k)[
        "C"
    ]
    result = cupy.asnumpy(d_c).astype(np.float64)
    assert np.isfinite(result).all()
    error = np.linalg.norm(result - expected) / np.linalg.norm(expected)
    assert error < 1e-5, f"relative L2 error {error:.3g} for {c} on {shape}"
