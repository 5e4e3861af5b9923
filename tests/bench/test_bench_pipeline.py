"""benchmarks/bench_pipeline.py without a GPU: the sample, Kernel Tuner's view of it, the report,
and two of the three methods end to end on a small GEMM (surrotune with a fake GPU worker, the
sequential loop with a fake CuPy), compiling for real with NVRTC."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from surrotune.backends.nvrtc import NvrtcNotFound, find_nvrtc
from surrotune.experiment import Experiment
from surrotune.space import SearchSpace
from surrotune.template import Template

REPO = Path(__file__).resolve().parents[2]


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_pipeline", REPO / "benchmarks" / "bench_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_pipeline"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _has_nvrtc() -> bool:
    try:
        find_nvrtc()
    except NvrtcNotFound:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(
    not _has_nvrtc(), reason="NO NVRTC: pip install nvidia-cuda-nvrtc"
)


@pytest.fixture(scope="module")
def gemm() -> Experiment:
    return bench.benchmark_experiment(REPO / "experiments" / "gemm.toml")  # type: ignore[no-any-return]


def test_every_method_measures_alike(gemm: Experiment) -> None:
    evaluation = gemm.evaluation
    assert evaluation.warmup == 0 and evaluation.repeats == 7


def test_the_sample_is_feasible_distinct_and_repeatable(gemm: Experiment) -> None:
    configs = bench.sample_configs(gemm, 50, seed=3)
    assert configs == bench.sample_configs(gemm, 50, seed=3)
    assert configs != bench.sample_configs(gemm, 50, seed=4)
    space = SearchSpace(gemm.parameters, gemm.constraints, gemm.sizes)
    assert all(space.is_feasible(c) for c in configs)
    assert len({bench.config_key(c) for c in configs}) == 50
    assert all(type(v) is int for c in configs for v in c.values())  # plain ints, not NumPy


def test_kernel_tuner_launches_the_same_kernels(gemm: Experiment) -> None:
    assert gemm.kernel is not None
    template = Template.from_file(gemm.kernel.template)
    configs = bench.sample_configs(gemm, 300, seed=0)
    problem = bench.kernel_tuner_problem(gemm, template, configs)
    assert bench.check_kernel_tuner_geometry(gemm, configs, problem) == []
    assert problem.tune_params["config"] == list(range(300))
    params = {"config": 7, "block_size_x": problem.tune_params["block_size_x"][0]}
    assert problem.source(params) == template.render({**gemm.sizes, **configs[7]})
    # a problem whose grid is off by a tile is caught
    wrong = dataclasses.replace(problem, grid_div_x=lambda p: 2 * configs[p["config"]]["BLOCK_N"])
    assert len(bench.check_kernel_tuner_geometry(gemm, configs, wrong)) == 300


def test_the_report_compares_with_the_sequential_loop() -> None:
    runs = [
        bench.MethodRun("surrotune", 2.0, {"a": "ok", "b": "resource"}, {"a": 1.0}),
        bench.MethodRun("sequential", 20.0, {"a": "ok", "b": "resource"}, {"a": 1.1}),
        bench.MethodRun("kernel_tuner", 0.5, {"a": "compile"}, error="RuntimeError: boom"),
    ]
    rows = bench.summarize(runs)
    assert [r["ratio_to_sequential"] for r in rows] == [10.0, 1.0, 20.0]
    assert rows[0]["configs_per_s"] == 1.0 and rows[1]["statuses"] == {"ok": 1, "resource": 1}
    assert [r["ok_disagreements_with_surrotune"] for r in rows] == [0, 0, 1]
    assert rows[1]["median_kernel_time_ratio_to_surrotune"] == 1.1
    table = bench.format_table(rows)
    assert "| surrotune | 2 | 2.0 | 1.00 | 10.00 | ok=1 resource=1 |" in table
    assert "RuntimeError: boom" in table
    json.dumps(rows)  # the --out document holds these rows
    assert math.isnan(bench.MethodRun("x", 0.0).configs_per_s)


def test_a_dry_run_checks_the_whole_sample_without_a_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.main(["--dry-run", "--configs", "120", "--limit", "0"]) == 0
    assert "120 configurations; Kernel Tuner's launches differ for 0" in capsys.readouterr().out


# --------------------------------------------------------------------------- end to end, small


SMALL = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "TM": 4, "TN": 8, "VEC": 1, "PAD": 0,
     "UNROLL": 0, "DOUBLE_BUFFER": 0},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 8, "TM": 8, "TN": 4, "VEC": 2, "PAD": 1,
     "UNROLL": 1, "DOUBLE_BUFFER": 1},
]  # fmt: skip


@pytest.fixture
def small(gemm: Experiment) -> Experiment:
    return dataclasses.replace(gemm, sizes={"M": 96, "N": 80, "K": 48})


class _Array:
    """A CuPy array as the sequential loop uses it: fill, get, and the NumPy data inside."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data.copy()

    def fill(self, value: float) -> None:
        self.data.fill(value)

    def get(self) -> np.ndarray:
        return self.data.copy()


def _fake_cupy(sizes: dict[str, int], launched: list[tuple[Any, Any]]) -> Any:
    """Enough of CuPy for the sequential loop: every kernel computes the exact GEMM."""

    class Module:
        def load(self, cubin: bytes) -> None:
            assert cubin.startswith(b"\x7fELF")

        def get_function(self, name: str) -> Any:
            def gemm(grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
                launched.append((grid, block))
                a, b, c = (arg.data for arg in args[:3])
                m, n, k = sizes["M"], sizes["N"], sizes["K"]
                c[...] = (a.reshape(m, k) @ b.reshape(k, n)).reshape(c.shape)

            assert name == "gemm"
            return gemm

    class Event:
        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

    class Error(Exception):
        pass

    cuda = SimpleNamespace(
        Device=lambda *a: SimpleNamespace(synchronize=lambda: None),
        Event=Event,
        get_elapsed_time=lambda start, end: 0.5,
        function=SimpleNamespace(Module=Module),
        driver=SimpleNamespace(CUDADriverError=Error),
        runtime=SimpleNamespace(CUDARuntimeError=Error),
    )
    return SimpleNamespace(cuda=cuda, asarray=_Array)


@needs_nvrtc
def test_surrotune_and_the_sequential_loop_on_a_small_gemm(
    small: Experiment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from surrotune.backends.worker import compute_expected, create_inputs
    from tests.backends.test_pipeline import numbering_factory

    assert small.kernel is not None
    space = SearchSpace(small.parameters, small.constraints, small.sizes)
    assert all(space.is_feasible(c) for c in SMALL)
    ours = bench.run_surrotune(
        small, SMALL, batch_size=4, cache_dir=tmp_path / "cache", worker_factory=numbering_factory
    )
    assert ours.error == "" and ours.configs == 2 and ours.device["name"] == "NVIDIA H200"
    assert set(ours.statuses.values()) == {"ok"} and ours.compile_s > 0

    launched: list[tuple[Any, Any]] = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(dict(small.sizes), launched))
    inputs = create_inputs(small.arguments, small.sizes, small.evaluation.seed)
    plain = bench.run_sequential(
        small,
        Template.from_file(small.kernel.template),
        SMALL,
        inputs=inputs,
        expected=compute_expected(small, inputs),
        arch="sm_90",
        library=find_nvrtc(),
    )
    assert plain.error == "" and plain.statuses == ours.statuses
    assert plain.times_ms == {bench.config_key(c): 0.5 for c in SMALL}
    assert len(launched) == 2 * (1 + 7)  # verified once, timed 7 times, each
    assert launched[0] == ((2, 2, 1), (128, 1, 1))  # cdiv(80, 64), cdiv(96, 64); 16 x 8
    rows = bench.summarize([ours, plain])
    assert rows[1]["ok_disagreements_with_surrotune"] == 0


@needs_nvrtc
def test_main_writes_what_each_method_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []

    def fake_surrotune(experiment: Experiment, configs: list[Any], **kw: Any) -> Any:
        seen.append(len(configs))
        statuses = {bench.config_key(c): "ok" for c in configs}
        return bench.MethodRun("surrotune", 0.5, statuses, device={"name": "GPU", "arch": "sm_90"})

    monkeypatch.setattr(bench, "run_surrotune", fake_surrotune)
    out = tmp_path / "pipeline.json"
    assert (
        bench.main(["--methods", "surrotune", "--configs", "9", "--limit", "3", "--out", str(out)])
        == 0
    )
    assert seen == [3]
    document = json.loads(out.read_text())
    assert document["configs"] == 3 and document["device"]["name"] == "GPU"
    assert document["measure"]["repeats"] == 7 and document["nvrtc"].startswith("nvrtc ")
    (row,) = document["methods"]
    assert row["method"] == "surrotune" and row["configs_per_s"] == 6.0
    assert "| surrotune | 3 | 0.5 | 6.00 | - | ok=3 |" in capsys.readouterr().out
