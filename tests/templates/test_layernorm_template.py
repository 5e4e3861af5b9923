"""templates/layernorm.cu: its declared search space, its failure regions under nvcc, and (on a
GPU) its results against NumPy for hidden sizes that are multiples of nothing."""

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
from surrotune.experiment import load_experiment
from surrotune.template import Template
from tests.templates.template_support import (
    assert_in_declared_space,
    declared_space,
    feasible,
    load_reference,
)

REPO = Path(__file__).resolve().parents[2]
LAYERNORM = REPO / "templates" / "layernorm.cu"
EXPERIMENT = REPO / "experiments" / "layernorm.toml"
REFERENCE = REPO / "experiments" / "layernorm_reference.py"
NAMES = ("THREADS_PER_ROW", "ROWS_PER_BLOCK", "VEC", "ALGO", "CACHE", "UNROLL")
HIDDEN = 4096  # the experiment's default
STATIC_SHARED_LIMIT = 48 * 1024
REGISTERS_PER_BLOCK = 65536


def config(*values: int) -> dict[str, int]:
    return dict(zip(NAMES, values, strict=True))


def threads(c: Mapping[str, int]) -> int:
    return c["THREADS_PER_ROW"] * c["ROWS_PER_BLOCK"]


def shared_bytes(c: Mapping[str, int], hidden: int = HIDDEN) -> int:
    """Static shared memory as the template declares it: the cached rows (CACHE = 1) and, when a
    row spans several warps, three partial statistics per warp and reduction."""
    rows = c["ROWS_PER_BLOCK"] * hidden if c["CACHE"] == 1 else 0
    warps_per_row = c["THREADS_PER_ROW"] // 32
    slots = 2 if c["ALGO"] == 0 else 1
    partials = slots * c["ROWS_PER_BLOCK"] * warps_per_row * 3 if warps_per_row > 1 else 0
    return 4 * (rows + partials)


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_file(LAYERNORM)


def test_every_parameter_is_a_placeholder(template: Template) -> None:
    params, _, _ = declared_space(template.text)
    assert tuple(params) == NAMES
    assert template.placeholders == frozenset((*NAMES, "HIDDEN"))  # HIDDEN: a problem size


def test_the_experiment_declares_the_same_space(template: Template) -> None:
    params, constraints, _ = declared_space(template.text)
    experiment = load_experiment(EXPERIMENT)
    assert {name: list(values) for name, values in experiment.parameters.items()} == params
    assert list(experiment.constraints) == constraints
    assert experiment.sizes["HIDDEN"] == HIDDEN
    # x and y alone are far past the H200's 60 MB L2, so DRAM bandwidth is what is measured
    assert 2 * 4 * experiment.sizes["ROWS"] * experiment.sizes["HIDDEN"] > 4 * 60e6


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
    assert 0.1 * count < over < 0.4 * count
    assert all(32 <= threads(c) <= 1024 for c in configs)
    # ...and so do the configurations that read x once, with float4, from registers
    assert any(c["VEC"] == 4 and c["CACHE"] == 0 for c in configs)


#: (config, what nvcc must say) at HIDDEN = 4096 — the edges of the space and its failure regions
SAMPLES: list[tuple[dict[str, int], str]] = [
    (config(128, 1, 4, 0, 0, 0), "ok"),  # float4, row in registers: x read once, two-pass
    (config(1024, 1, 4, 1, 0, 0), "ok"),  # a block per row, one vector per thread, Welford
    (config(16, 2, 1, 2, 2, 1), "ok"),  # half-warp rows, scalar, re-read, rolled loops
    (config(64, 2, 2, 0, 1, 4), "ok"),  # two rows in shared memory: 32 KB
    (config(16, 2, 4, 2, 0, 0), "spills"),  # 256 floats per thread in registers
    (config(32, 32, 1, 0, 0, 0), "too many registers"),  # compiles, cannot launch
    (config(32, 4, 4, 1, 1, 0), "resource"),  # four rows in shared memory: 64 KB
]


@pytest.fixture(scope="module")
def compiled(template: Template) -> list[CompiledKernel | CompileError]:
    requests = [
        CompileRequest(template.render({**c, "HIDDEN": HIDDEN}), "layernorm", arch="sm_90")
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
    elif expected == "spills":
        assert resources.spill_store_bytes > 0
    else:
        assert needed <= REGISTERS_PER_BLOCK
        assert resources.spill_store_bytes == 0


@pytest.mark.nvcc
def test_a_config_outside_the_space_fails_to_compile(template: Template) -> None:
    """The static_asserts catch what the constraints exclude, as a compile (not resource) error."""
    with pytest.raises(CompileError) as info:
        source = template.render({**config(128, 1, 4, 0, 0, 2), "HIDDEN": HIDDEN})
        compile_kernel(CompileRequest(source, "layernorm"))
    assert not info.value.is_resource
    assert "a row cached in registers needs UNROLL = 0" in info.value.message


def test_reference_is_layer_norm_in_float64() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    gamma = rng.standard_normal(7).astype(np.float32)
    beta = rng.standard_normal(7).astype(np.float32)
    out = load_reference(REFERENCE)(x=x, gamma=gamma, beta=beta, y=np.zeros_like(x), rows=3)["y"]
    assert out.dtype == np.float64
    assert out.shape == x.shape
    a = x.astype(np.float64)
    for r in range(3):
        mean = sum(a[r]) / 7
        var = sum((v - mean) ** 2 for v in a[r]) / 7  # biased, as torch's layer_norm
        expected = (a[r] - mean) / np.sqrt(var + 1e-5) * gamma + beta
        np.testing.assert_allclose(out[r], expected, rtol=1e-12)


GPU_CONFIGS = [
    config(128, 1, 4, 0, 0, 0),  # the fast corner: registers, float4
    config(1024, 1, 4, 1, 0, 0),  # 32 warps per row, most threads idle at small sizes
    config(16, 8, 2, 2, 2, 1),  # half-warp rows, re-read, rolled loops
    config(64, 2, 4, 1, 1, 4),  # shared-memory rows over two warps, Welford, partial unroll
    config(32, 32, 1, 0, 2, 2),  # 1024 threads, scalar, re-read three times
    config(256, 4, 4, 2, 2, 0),  # fully unrolled re-reads, sum of squares
]
#: (rows, hidden): a tail in every thread's last vector (1000: float4), hidden % 4 == 2 (float2
#: instead of float4), odd (scalar), and the default hidden size (no tail) with a partial block
GPU_SHAPES = [(37, 1000), (33, 1026), (5, 771), (7, 4096)]


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("index", range(len(GPU_CONFIGS)))
def test_layernorm_matches_numpy(
    template: Template, tmp_path: Path, index: int, shape: tuple[int, int]
) -> None:
    import cupy

    c = GPU_CONFIGS[index]
    rows, hidden = shape
    source = template.render({**c, "HIDDEN": hidden})
    kernel = compile_kernel(CompileRequest(source, "layernorm", arch="sm_90"))
    cubin = tmp_path / "layernorm.cubin"
    cubin.write_bytes(kernel.cubin)
    layernorm = cupy.RawModule(path=str(cubin)).get_function("layernorm")

    rng = np.random.default_rng(index)
    # a non-zero mean, so that a wrong mean cannot hide behind a zero one
    x = (rng.standard_normal((rows, hidden)) + 0.5).astype(np.float32)
    gamma = rng.standard_normal(hidden).astype(np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32)
    d_x, d_gamma, d_beta = cupy.asarray(x), cupy.asarray(gamma), cupy.asarray(beta)
    d_y = cupy.full((rows, hidden), np.nan, dtype=cupy.float32)  # every element must be written
    grid = (-(-rows // c["ROWS_PER_BLOCK"]),)
    layernorm(grid, (threads(c),), (d_x, d_gamma, d_beta, d_y, np.int32(rows)))
    cupy.cuda.runtime.deviceSynchronize()

    expected = load_reference(REFERENCE)(
        x=x, gamma=gamma, beta=beta, y=np.empty_like(x), rows=rows
    )["y"]
    result = cupy.asnumpy(d_y).astype(np.float64)
    assert np.isfinite(result).all()
    error = np.linalg.norm(result - expected) / np.linalg.norm(expected)
    assert error < 1e-5, f"relative L2 error {error:.3g} for {c} on {shape}"
