"""``surrotune export --format csv|parquet|kernel-tuner|t4|recording``: every trial with every
field, and each format round-trips: export, replay, the same best configuration."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from analysis_studies import TINY_BEST, Storages

from surrotune.analysis import open_study, read_table, table_dataset
from surrotune.analysis.export import FORMATS, infer_format
from surrotune.backends.replay import Dataset, ReplayBackend, load_dataset
from surrotune.cli import main
from surrotune.result import USER_ATTRS
from surrotune.runner import Runner
from surrotune.sampling import make_sampler
from surrotune.space import RecordedSpace
from surrotune.verdicts import ranked_ok_trials

#: format -> file name
FILES = {
    "recording": "export.json.gz",
    "kernel-tuner": "export_kt.json",
    "t4": "export_t4.json",
    "csv": "export.csv",
    "parquet": "export.parquet",
}


def export(storage: Path, study: str, fmt: str, out: Path) -> Path:
    path = out / FILES[fmt]
    assert main(["export", str(storage), "--study", study, "--format", fmt, "-o", str(path)]) == 0
    return path


def best_params(study: optuna.Study) -> dict[str, Any]:
    return dict(ranked_ok_trials(study)[0].params)


def replay_best(dataset: Dataset) -> dict[str, Any]:
    """Brute force over the dataset with surrotune's runner: the best configuration found."""
    space = RecordedSpace(dataset)
    study = optuna.create_study(
        direction=dataset.direction, sampler=make_sampler("brute-force", space, seed=0)
    )
    Runner(study=study, space=space, backend=ReplayBackend(dataset),
           trials=len(dataset.results), batch_size=8).run()  # fmt: skip
    return best_params(study)


# ------------------------------------------------------------------- tables


@pytest.fixture(scope="module")
def gemm_tables(storages: Storages, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("pyarrow")
    out = tmp_path_factory.mktemp("tables")
    return {fmt: export(storages.gemm, "quickstart", fmt, out) for fmt in ("csv", "parquet")}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_table_holds_every_trial_with_every_field(
    storages: Storages, gemm_tables: dict[str, Path], fmt: str
) -> None:
    study = open_study(str(storages.gemm))
    frame = read_table(gemm_tables[fmt])
    trials = study.trials
    assert len(frame) == len(trials)
    assert frame["number"].tolist() == [t.number for t in trials]
    for name in study.trials[0].params:
        assert f"params_{name}" in frame
    attrs = {k for t in trials for k in t.user_attrs} - {"counters"}
    assert attrs <= set(frame.columns), attrs - set(frame.columns)
    assert {"state", "value", "status", "measured", "datetime_start", "duration_s"} <= set(
        frame.columns
    )
    by_number = frame.set_index("number")
    for trial in trials[:25]:
        row = by_number.loc[trial.number]
        assert row["state"] == trial.state.name
        for name, value in trial.params.items():
            assert row[f"params_{name}"] == value
        for key, value in trial.user_attrs.items():
            if key == "counters":
                continue
            cell = row[key]
            if isinstance(value, float):
                assert cell == pytest.approx(value)
            elif isinstance(value, list):
                assert list(cell) == pytest.approx(value), key
            elif value is None:
                assert cell is None or (isinstance(cell, float) and math.isnan(cell))
            else:
                assert cell == value, key


def test_csv_and_parquet_agree(gemm_tables: dict[str, Path]) -> None:
    csv, parquet = read_table(gemm_tables["csv"]), read_table(gemm_tables["parquet"])
    assert list(csv.columns) == list(parquet.columns)
    for column in ("number", "status", "value", "time_ms", "registers", "config_key"):
        pd.testing.assert_series_equal(
            csv[column], parquet[column], check_dtype=False, check_names=False
        )

    def repeats(frame: pd.DataFrame) -> list[int]:
        return frame["times_ms"].map(lambda t: len(t) if isinstance(t, list) else 0).tolist()

    assert repeats(csv) == repeats(parquet) and max(repeats(csv)) == 7


def test_table_counters_become_columns(storages: Storages, tmp_path: Path) -> None:
    """Hardware counters, one column each, as ``counters.<metric>``."""
    from surrotune.analysis import read_study_trials, write_table

    study = read_study_trials(open_study(str(storages.tiny), "tiny"))
    frame = study.frame.copy()
    frame["counters.dram__throughput.avg.pct_of_peak_sustained_elapsed"] = 42.0
    study = type(study)(**{**study.__dict__, "frame": frame})
    write_table(study, tmp_path / "t.csv", "csv")
    back = read_table(tmp_path / "t.csv")
    assert (back["counters.dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 42.0).all()
    dataset = table_dataset(tmp_path / "t.csv")
    counters = next(iter(dataset.results.values())).counters
    assert counters == {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 42.0}


# ------------------------------------------------------------------- round trips


@pytest.fixture(scope="module")
def tiny_exports(storages: Storages, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tiny_exports")
    formats = [f for f in FORMATS if f != "parquet" or importlib.util.find_spec("pyarrow")]
    return {fmt: export(storages.tiny, "tiny", fmt, out) for fmt in formats}


@pytest.mark.parametrize("fmt", ["recording", "kernel-tuner", "t4", "csv", "parquet"])
def test_export_replays_to_the_same_best_configuration(
    storages: Storages, tiny_exports: dict[str, Path], fmt: str
) -> None:
    if fmt not in tiny_exports:
        pytest.skip("pyarrow is not installed")
    path = tiny_exports[fmt]
    study = open_study(str(storages.tiny), "tiny")
    dataset = table_dataset(path) if fmt in ("csv", "parquet") else load_dataset(path)
    assert len(dataset.results) == 32
    assert dataset.optimum.config == TINY_BEST == best_params(study)
    assert dataset.optimum.objective == pytest.approx(ranked_ok_trials(study)[0].value)
    assert replay_best(dataset) == TINY_BEST
    # every configuration replays to what the study measured (Kernel Tuner has two failures)
    for trial in study.trials:
        result = dataset.lookup(trial.params)
        assert result is not None
        expected = trial.user_attrs["status"]
        if fmt == "kernel-tuner" and expected not in ("ok", "compile"):
            expected = "resource"
        assert result.status.value == expected
        if result.ok:
            assert result.objective == pytest.approx(trial.value)
            assert list(result.times_ms) == pytest.approx(trial.user_attrs["times_ms"])
        assert result.compile_time_ms == pytest.approx(trial.user_attrs["compile_time_ms"])


def test_recording_export_replays_with_the_cli(
    tiny_exports: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Kernel Tuner cache and the T4 file replay as they are: surrotune run --dataset."""
    for fmt in ("kernel-tuner", "t4"):
        capsys.readouterr()
        code = main(["run", "--dataset", str(tiny_exports[fmt]), "--sampler", "brute-force",
                     "--trials", "32", "--storage", str(tmp_path / f"{fmt}.db"), "--no-progress",
                     "--remeasure", "0"])  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0 and "bx=64 by=4 u=1" in out and "reached 100.0 %" in out, out


def test_kernel_tuner_cache_has_kernel_tuner_s_layout(tiny_exports: dict[str, Path]) -> None:
    doc = json.loads(tiny_exports["kernel-tuner"].read_text())
    assert doc["tune_params_keys"] == ["bx", "by", "u"]
    assert doc["objective"] == "time" and doc["device_name"] == "Test GPU"
    entry = doc["cache"]["64,4,1"]
    assert entry["time"] == 1.0 and entry["times"] == [1.0, 1.01, 0.99]
    assert {"compile_time", "verification_time", "benchmark_time", "timestamp"} <= set(entry)
    assert doc["cache"]["8,4,1"]["__error__"] == "CompilationFailedConfig"
    assert doc["cache"]["64,16,0"]["__error__"] == "RuntimeFailedConfig"


def test_kernel_tuner_simulation_mode_reads_the_cache(
    tiny_exports: dict[str, Path], tmp_path: Path
) -> None:
    """Kernel Tuner itself, in simulation mode, finds the same best configuration."""
    pytest.importorskip("kernel_tuner")
    import contextlib
    import io
    import shutil
    import warnings

    from kernel_tuner.interface import tune_cache

    cache = tmp_path / "cache.json"
    shutil.copy(tiny_exports["kernel-tuner"], cache)  # Kernel Tuner writes to its cache file
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = tune_cache(cache_path=str(cache), strategy="brute_force", quiet=True)
    valid = [r for r in results if "__error__" not in r]
    best = min(valid, key=lambda r: r["time"])
    assert {k: best[k] for k in TINY_BEST} == TINY_BEST and best["time"] == 1.0


def test_t4_file_validates_against_kernel_tuner_s_schema(tiny_exports: dict[str, Path]) -> None:
    pytest.importorskip("kernel_tuner")
    jsonschema = pytest.importorskip("jsonschema")
    from kernel_tuner.file_utils import output_file_schema

    _, schema = output_file_schema("results")
    doc = json.loads(tiny_exports["t4"].read_text())
    jsonschema.validate(doc, schema)
    invalidity = {r["invalidity"] for r in doc["results"]}
    assert invalidity == {"correct", "compile", "runtime"}
    assert doc["metadata"]["timeunit"] == "milliseconds"


def test_exports_of_a_real_study_keep_its_optimum(storages: Storages, tmp_path: Path) -> None:
    """The W7800 study (127 configurations, 36 of them failing): every dataset format loads back
    with every configuration and the study's winner."""
    study = open_study(str(storages.conv), "W7800")
    winner = best_params(study)
    for fmt in ("recording", "kernel-tuner", "t4"):
        dataset = load_dataset(export(storages.conv, "W7800", fmt, tmp_path))
        assert len(dataset.results) == 127, fmt
        assert dataset.optimum.config == winner, fmt
        failed = sum(not r.ok for r in dataset.results.values())
        assert failed == sum(t.user_attrs["status"] != "ok" for t in study.trials), fmt


# ------------------------------------------------------------------- the command line


def test_format_is_inferred_from_the_file_name(
    storages: Storages, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert infer_format("x.csv") == "csv" and infer_format("x.parquet") == "parquet"
    assert infer_format("x.json.gz") == "recording"
    path = tmp_path / "all.csv"
    assert main(["export", str(storages.tiny), "--study", "tiny", "-o", str(path)]) == 0
    assert "wrote 32 trials of study 'tiny'" in capsys.readouterr().out
    assert set(pd.read_csv(path)["study"]) == {"tiny"}
    assert set(USER_ATTRS) - {"counters"} <= set(pd.read_csv(path).columns)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "{root}/none.db", "-o", "{root}/x.csv"], "none.db: no such storage file"),
        (["export", "{tiny}", "-o", "{root}/x.csv"], "holds 2 studies; choose one with --study"),
        (["export", "{tiny}", "--study", "nope", "-o", "{root}/x.csv"], "no study 'nope'"),
    ],
)
def test_export_bad_input_exits_2(
    storages: Storages, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(root=storages.root, tiny=storages.tiny) for a in args]
    assert main(filled) == 2
    assert message in capsys.readouterr().err
    assert not (storages.root / "x.csv").exists()
