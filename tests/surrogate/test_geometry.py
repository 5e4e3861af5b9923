"""Launch-geometry features: computed from the experiment's [launch] at the problem size, kept
in bundles, and re-read at a warm start's target sizes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from surrotune.backends.replay import load_dataset
from surrotune.experiment import load_experiment
from surrotune.space import SearchSpace
from surrotune.surrogate.bundle import bundle_from_dataset, load_bundle
from surrotune.surrogate.geometry import (
    LaunchShape,
    launch_shape_of_experiment,
    launch_shape_of_recording,
)
from surrotune.surrogate.sampler import SurrogateSampler, _Table
from surrotune.surrogate.transfer import Source

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "experiments" / "gemm.toml"
GEMM_2048 = REPO / "experiments" / "datasets" / "gemm_h200.json.gz"
GEMM_1024 = REPO / "experiments" / "datasets" / "gemm_1024_h200.json.gz"
SHARED = REPO.parent / "shared" / "datasets" / "kernel_tuner"

TILES = pd.DataFrame(
    [
        {"BLOCK_M": 128, "BLOCK_N": 256, "TM": 8, "TN": 8},  # the optimum at 2048
        {"BLOCK_M": 64, "BLOCK_N": 128, "TM": 8, "TN": 4},  # the optimum at 1024
    ]
)


def test_columns_are_blocks_threads_waves_and_fill() -> None:
    shape = launch_shape_of_experiment(load_experiment(GEMM), {"multiProcessorCount": 132})
    assert shape is not None and shape.sizes == {"M": 2048, "N": 2048, "K": 2048}
    columns = shape.columns(TILES)
    # 2048/256 x 2048/128 = 128 blocks of 16 x 32 = 512 threads; 64 x 128 tiles: 512 blocks
    # of 8 x 32 = 256 threads, 3.88 waves, the last one 88 % full
    assert columns[0] == pytest.approx([7, 9, math.log2(128 / 132), 128 / 132])
    assert columns[1] == pytest.approx([9, 8, math.log2(512 / 132), (512 / 132) / 4])
    at_1024 = shape.at({"M": 1024, "N": 1024, "K": 1024}, 132).columns(TILES)
    assert at_1024[1] == pytest.approx([7, 8, math.log2(128 / 132), 128 / 132])
    assert at_1024[0][0] == pytest.approx(5)  # 32 blocks: a quarter of a wave


def test_without_an_sm_count_there_are_no_wave_columns_even_at_a_target_that_has_one() -> None:
    shape = launch_shape_of_experiment(load_experiment(GEMM), None)
    assert shape is not None and shape.n_columns == 2 and shape.columns(TILES).shape == (2, 2)
    assert shape.at({"M": 1024, "N": 1024, "K": 1024}, 132).columns(TILES).shape == (2, 2)


def test_json_round_trip() -> None:
    shape = LaunchShape(("cdiv(N, B)",), ("B",), {"N": 100}, 132)
    assert LaunchShape.from_json(shape.to_json()) == shape
    assert LaunchShape.from_json(None) is None


def test_a_recording_names_its_experiment_and_a_kernel_tuner_cache_does_not() -> None:
    shape = launch_shape_of_recording(load_dataset(GEMM_1024))
    assert shape is not None
    assert shape.sizes == {"M": 1024, "N": 1024, "K": 1024} and shape.sm_count == 132
    cache = SHARED / "convolution_milo" / "A100.json.gz"
    if not cache.is_file():
        pytest.skip(f"the shared Kernel Tuner recordings are not at {cache}")
    assert launch_shape_of_recording(load_dataset(cache)) is None


def test_the_sampler_s_features_carry_the_geometry() -> None:
    dataset = load_dataset(GEMM_1024)
    space = SearchSpace(dataset.parameters, dataset.constraints, dataset.problem_size)
    plain = _Table.build(space, SurrogateSampler(space=space, seed=0), np.random.default_rng(0))
    shape = launch_shape_of_recording(dataset)
    off = SurrogateSampler(space=space, seed=0, launch_shape=shape)  # known, not used: default
    assert _Table.build(space, off, np.random.default_rng(0)).features.shape == (
        plain.features.shape
    )
    sampler = SurrogateSampler(space=space, seed=0, launch_shape=shape, launch_features=True)
    table = _Table.build(space, sampler, np.random.default_rng(0))
    assert table.features.shape[1] == plain.features.shape[1] + 4
    assert np.allclose(table.features[:, -4:], shape.columns(table.frame), rtol=1e-6)


def test_a_bundle_keeps_its_geometry_and_is_read_at_the_target_s_sizes(tmp_path: Path) -> None:
    assert bundle_from_dataset(GEMM_2048).encoding.launch_shape is None  # the default
    bundle = bundle_from_dataset(GEMM_2048, launch_features=True)
    assert bundle.encoding.launch_shape is not None
    assert bundle.encoding.launch_shape.sizes == {"M": 2048, "N": 2048, "K": 2048}
    loaded = load_bundle(bundle.save(tmp_path / "gemm.json"))
    configs = [r.config for r in list(load_dataset(GEMM_2048).results.values())[:200]]
    frame = pd.DataFrame([entry["config"] for entry in bundle.top] + configs)
    assert np.allclose(loaded.predict(frame), bundle.predict(frame))
    same = Source.on(loaded, frame, bundle.encoding.launch_shape)
    assert same.top is not None and np.isfinite(same.top).any()  # measured at these sizes
    target = launch_shape_of_recording(load_dataset(GEMM_1024))
    resized = Source.on(loaded, frame, target)
    # at 1024³ only the source's best measurement at 2048³ leads, and its predictions change
    assert resized.top is not None
    assert np.isfinite(same.top).sum() > 1
    assert list(np.flatnonzero(np.isfinite(resized.top))) == [0]
    assert resized.top[0] == 0 and same.top[0] == 0  # frame row 0 is the best measured
    assert not np.allclose(resized.mean, same.mean)


def test_the_transfer_bench_s_launch_features_reach_every_surrogate_run() -> None:
    from surrotune.bench.harness import _make, with_launch_shape
    from surrotune.bench.transfer import Pair, _tasks

    pair = Pair(str(GEMM_2048), str(GEMM_1024))
    bundles = {pair.source: [Path("source.json.gz")]}
    methods = ["cold", "warm", "enqueue", "enqueue-tpe"]
    plain = _tasks([pair], bundles, methods, [0], 10, 60.0, "prior", 10)
    on = _tasks([pair], bundles, methods, [0], 10, 60.0, "prior", 10, launch_features=True)
    geometry = ("attrs", (("launch_features", True),))
    assert not any(geometry in t.sampler.options for t in plain)
    assert [geometry in t.sampler.options for t in on] == [True, True, True, False]
    dataset = load_dataset(GEMM_1024)
    space = SearchSpace(dataset.parameters, dataset.constraints, dataset.problem_size)
    cold = with_launch_shape(_make(on[0].sampler, space, seed=0), dataset)
    assert cold.launch_features and cold.launch_shape == launch_shape_of_recording(dataset)
    default = with_launch_shape(_make(plain[0].sampler, space, seed=0), dataset)
    assert default.launch_shape is None


def test_at_other_sizes_only_the_best_measurement_leads_the_design() -> None:
    bundle = bundle_from_dataset(GEMM_2048)  # parameters only: no launch geometry
    frame = pd.DataFrame([entry["config"] for entry in bundle.top])
    here = Source.on(bundle, frame, None, {"M": 2048, "N": 2048, "K": 2048})
    assert here.top is not None and np.isfinite(here.top).all()
    elsewhere = Source.on(bundle, frame, None, {"M": 1024, "N": 1024, "K": 1024})
    assert elsewhere.top is not None
    assert elsewhere.top[0] == 0 and np.isinf(elsewhere.top[1:]).all()
    assert np.allclose(elsewhere.mean, here.mean)  # the predictions themselves do not move
    assert Source.on(bundle, frame).top is not None  # nothing known of the target's sizes
