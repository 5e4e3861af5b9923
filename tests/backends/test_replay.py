"""The replay backend and its dataset readers, checked against the shared Kernel Tuner datasets.

Expected counts are derived from the raw file text with regular expressions, independently of
the JSON readers under test; the status mapping is written out here a second time on purpose.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from surrotune.backends.base import Backend, DescribesDevice
from surrotune.backends.replay import (
    Dataset,
    DatasetError,
    ReplayBackend,
    load_dataset,
    load_restrictions,
    save_recording,
)
from surrotune.expressions import Expression
from surrotune.result import Result, Status

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "kernel_tuner"
DATASET_FILES = sorted(str(p.relative_to(SHARED)) for p in SHARED.glob("*/*.json.gz"))
CONV_A100 = "convolution_milo/A100.json.gz"
CONV_A100_T4 = "convolution_milo/A100_T4.json.gz"

KT_STATUS = {
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "resource",
    "InvalidConfig": "constraint",
}
T4_STATUS = {"correct": "ok", "compile": "compile", "runtime": "resource"}


def _text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


def _grep_counts(text: str) -> Counter[str]:
    """Status counts from the raw text: each KT entry and T4 result has one "timestamp".

    Some shared caches are pretty-printed (one field per line), so lines are not entries.
    """
    counts: Counter[str] = Counter()
    if '"invalidity"' in text:
        for value in re.findall(r'"invalidity":\s*"(\w+)"', text):
            counts[T4_STATUS[value]] += 1
        return counts
    failures = re.findall(r'"time":\s*"(\w+)"', text)
    for marker in failures:
        counts[KT_STATUS[marker]] += 1
    ok = len(re.findall(r'"timestamp":', text)) - len(failures)
    if ok:
        counts["ok"] = ok
    return counts


# ---------------------------------------------------------------------------- shared datasets


@pytest.mark.parametrize("name", DATASET_FILES)
def test_every_shared_dataset_loads_with_the_counts_grep_finds(
    kt_datasets: Path, name: str
) -> None:
    path = kt_datasets / name
    dataset = load_dataset(path)
    expected = _grep_counts(_text(path))
    assert Counter(r.status.value for r in dataset.results.values()) == expected
    assert dataset.format == ("t4" if name.endswith("_T4.json.gz") else "kernel_tuner")
    assert dataset.objective == "time" and dataset.direction == "minimize"
    assert dataset.device_name  # MI250X caches record "", the file stem stands in
    for key, result in dataset.results.items():
        assert dataset.key(result.config) == key
        assert (result.objective is not None) == result.ok
        assert result.ok == bool(result.times_ms)
        assert bool(result.error) != result.ok
    assert dataset.optimum.objective == min(r.objective for r in dataset.results.values() if r.ok)


def test_convolution_a100_has_the_documented_counts(kt_datasets: Path) -> None:
    dataset = load_dataset(kt_datasets / CONV_A100)
    counts = Counter(r.status for r in dataset.results.values())
    assert len(dataset.results) == 4362
    assert counts == {Status.OK: 4201, Status.COMPILE: 6, Status.RESOURCE: 155}
    assert dataset.kernel_name == "convolution_kernel"
    assert dataset.device_name == "NVIDIA A100-PCIE-40GB"
    assert dataset.problem_size == [4096, 4096]
    assert list(dataset.parameters)[:2] == ["block_size_x", "block_size_y"]
    assert dataset.parameters["block_size_y"] == [1, 2, 4, 8, 16]


def test_kt_timings_come_from_the_raw_entry(kt_datasets: Path) -> None:
    path = kt_datasets / CONV_A100
    raw = json.loads(_text(path))["cache"]
    dataset = load_dataset(path)
    for key in ("16,1,1,1,0,0,0,1,15,15", "256,4,4,4,1,0,0,1,15,15"):
        entry, result = raw[key], dataset.results[key]
        assert result.compile_time_ms == pytest.approx(entry["compile_time"])
        assert result.benchmark_time_ms == pytest.approx(
            entry["verification_time"] + entry["benchmark_time"]
        )
        assert list(result.times_ms) == entry.get("times", [])
        if result.ok:
            assert result.objective == entry["time"]
        else:
            assert (result.status, result.error) == (Status.RESOURCE, entry["time"])


def test_t4_and_kernel_tuner_files_of_one_run_give_the_same_results(kt_datasets: Path) -> None:
    kt = load_dataset(kt_datasets / CONV_A100)
    t4 = load_dataset(kt_datasets / CONV_A100_T4)
    assert list(t4.results) == list(kt.results)
    assert t4.parameters == kt.parameters
    for key, a in kt.results.items():
        b = t4.results[key]
        assert (b.config, b.status, b.objective, b.times_ms) == (
            a.config,
            a.status,
            a.objective,
            a.times_ms,
        )
        assert b.compile_time_ms == pytest.approx(a.compile_time_ms)


def test_frame_has_one_row_per_result_with_params_and_fields(kt_datasets: Path) -> None:
    dataset = load_dataset(kt_datasets / CONV_A100)
    frame = dataset.to_frame()
    assert len(frame) == 4362 and list(frame.index) == list(dataset.results)
    assert list(frame.columns[: len(dataset.parameters)]) == list(dataset.parameters)
    assert {"status", "objective", "time_ms", "compile_time_ms", "benchmark_time_ms"} <= set(
        frame.columns
    )
    assert frame["status"].value_counts().to_dict() == {"ok": 4201, "resource": 155, "compile": 6}
    assert frame.loc[frame["status"] != "ok", "objective"].isna().all()


# ---------------------------------------------------------------------------- restrictions


@pytest.mark.parametrize(("space", "count"), [("convolution_milo", 4), ("dedispersion_milo", 3)])
def test_restrictions_parse_and_hold_for_every_recorded_config(
    kt_datasets: Path, space: str, count: int
) -> None:
    expressions = load_restrictions(kt_datasets / "spaces" / f"{space}.json")
    dataset = load_dataset(kt_datasets / space / "A100.json.gz")
    assert len(expressions) == count
    frame = dataset.to_frame()
    env = {name: frame[name].to_numpy() for name in dataset.parameters}
    for text in expressions:
        expression = Expression.parse(text, known=dataset.parameters)
        # Kernel Tuner only records configurations that pass the restrictions
        assert np.all(expression.evaluate(env)), text


def test_restrictions_of_a_file_without_a_configuration_space(tmp_path: Path) -> None:
    path = tmp_path / "space.json"
    path.write_text('{"General": {}}')
    with pytest.raises(DatasetError, match="ConfigurationSpace") as info:
        load_restrictions(path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------- unclosed caches


def _unclosed_cache(kt_datasets: Path, entries: int) -> tuple[str, list[str]]:
    """The header and first entries of a real cache, as Kernel Tuner leaves it mid-run.

    Kernel Tuner writes the header without the closing ``}\\n}`` and then appends
    ``"\\n" + entry + ","`` per configuration.
    """
    lines = _text(kt_datasets / CONV_A100).splitlines()
    start = next(i for i, line in enumerate(lines) if line == '"cache": {') + 1
    body = [line.removesuffix("}}").removesuffix(",") for line in lines[start : start + entries]]
    body = [line if line.endswith("}") else line + "}" for line in body]
    header = "\n".join(lines[:start])
    return header + "".join("\n" + line + "," for line in body), body


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize(
    ("cut", "complete"),
    [
        ("after_comma", 30),
        ("after_entry_no_comma", 30),
        ("after_entry_newline", 30),
        ("mid_line", 29),
        ("mid_number", 29),
        ("after_last_brace", 30),
        ("header_only", 0),
    ],
)
def test_an_unclosed_cache_loads_its_complete_entries(
    kt_datasets: Path, tmp_path: Path, compress: bool, cut: str, complete: int
) -> None:
    text, body = _unclosed_cache(kt_datasets, 30)
    last = body[-1]
    text = {
        "after_comma": text,
        "after_entry_no_comma": text.removesuffix(","),
        "after_entry_newline": text + "\n",
        "mid_line": text.removesuffix(last + ",") + last[: len(last) // 2],
        "mid_number": text[: text.rindex('"time": ') + len('"time": 3.8')],
        "after_last_brace": text.removesuffix(",") + "}\n",
        "header_only": text[: text.index('"cache": {') + len('"cache": {')],
    }[cut]
    path = tmp_path / ("cache.json.gz" if compress else "cache.json")
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)

    dataset = load_dataset(path)
    full = load_dataset(kt_datasets / CONV_A100)
    expected_keys = [json.loads("{" + line + "}").popitem()[0] for line in body[:complete]]
    assert list(dataset.results) == expected_keys
    assert all(dataset.results[k] == full.results[k] for k in expected_keys)


def test_a_gzip_stream_cut_short_still_loads_the_entries_it_holds(
    kt_datasets: Path, tmp_path: Path
) -> None:
    text, _ = _unclosed_cache(kt_datasets, 200)
    data = gzip.compress(text.encode())
    path = tmp_path / "cut.json"  # no .gz: detected by the magic bytes
    path.write_bytes(data[: int(len(data) * 0.6)])
    dataset = load_dataset(path)
    assert 0 < len(dataset.results) < 200


def test_a_cache_cut_inside_its_header_is_an_error(kt_datasets: Path, tmp_path: Path) -> None:
    text, _ = _unclosed_cache(kt_datasets, 3)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"tune_params"') + 40])
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------- newer caches


def _kt_cache(entries: dict[str, dict[str, object]], objective: str = "time") -> dict[str, object]:
    return {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [1024],
        "tune_params_keys": ["bx", "vec"],
        "tune_params": {"bx": [32, 64, 128], "vec": [1, 2]},
        "objective": objective,
        "cache": entries,
    }


def test_failures_under_error_key_map_to_statuses(tmp_path: Path) -> None:
    entries: dict[str, dict[str, object]] = {
        "32,1": {"bx": 32, "vec": 1, "time": 1.5, "times": [1.5, 1.6], "compile_time": 10.0},
        "32,2": {"bx": 32, "vec": 2, "time": 1e20, "__error__": "CompilationFailedConfig"},
        "64,1": {"bx": 64, "vec": 1, "__error__": "RuntimeFailedConfig", "benchmark_time": 2},
        "64,2": {"bx": 64, "vec": 2, "time": None, "__error__": "InvalidConfig"},
        "128,1": {"bx": 128, "vec": 1, "time": 0.5, "times": [0.5], "__error__": None},
    }
    path = tmp_path / "new.json"
    path.write_text(json.dumps(_kt_cache(entries)))
    dataset = load_dataset(path)
    statuses = {key: r.status for key, r in dataset.results.items()}
    assert statuses == {
        "32,1": Status.OK,
        "32,2": Status.COMPILE,
        "64,1": Status.RESOURCE,
        "64,2": Status.CONSTRAINT,
        "128,1": Status.OK,
    }
    assert dataset.results["32,2"].error == "CompilationFailedConfig"
    assert dataset.results["32,2"].objective is None
    assert dataset.results["64,1"].benchmark_time_ms == 2.0
    assert dataset.results["32,1"].compile_time_ms == 10.0
    assert dataset.optimum.config == {"bx": 128, "vec": 1}


def test_a_rate_objective_is_maximised(tmp_path: Path) -> None:
    entries = {
        "32,1": {"bx": 32, "vec": 1, "time": 2.0, "GFLOP/s": 10.0},
        "64,1": {"bx": 64, "vec": 1, "time": 1.0, "GFLOP/s": 20.0},
        "64,2": {"bx": 64, "vec": 2, "time": "CompilationFailedConfig"},
    }
    path = tmp_path / "rate.json"
    path.write_text(json.dumps(_kt_cache(entries, objective="GFLOP/s")))
    dataset = load_dataset(path)
    assert (dataset.objective, dataset.direction) == ("GFLOP/s", "maximize")
    assert dataset.optimum.objective == 20.0
    assert dataset.results["64,2"].status is Status.COMPILE


# ---------------------------------------------------------------------------- bad files


def _write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty"),
        ("this is not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"hello": "world"}', "unknown layout"),
        (b"\x1f\x8bnot really gzip", "gzip"),
        (b"\xff\xfe\x00binary", "UTF-8"),
        ('{"tune_params_keys": ["a"], "cache": {}}', "tune_params"),
        (
            '{"tune_params_keys": ["a"], "tune_params": {"a": [1]}, "cache": {"1": {"a": 1}}}',
            "'1'",
        ),
        (
            '{"tune_params_keys": ["a"], "tune_params": {"a": [1]}, '
            '"cache": {"1": {"a": 1, "time": "MysteryFailedConfig"}}}',
            "MysteryFailedConfig",
        ),
        (
            '{"metadata": {}, "results": [{"configuration": {"a": 1}, "invalidity": "odd"}]}',
            "invalidity",
        ),
        ('{"format": "surrotune-recording", "version": 99}', "version"),
        ('{"format": "surrotune-recording", "version": 1, "parameters": {}}', "device"),
    ],
)
def test_bad_files_raise_dataset_error_naming_the_file(
    tmp_path: Path, content: str | bytes, message: str
) -> None:
    path = _write(tmp_path / "bad.json", content)
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_missing_file_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"missing\.json"):
        load_dataset(tmp_path / "missing.json")


# ---------------------------------------------------------------------------- recordings


def _results() -> list[Result]:
    return [
        Result(
            config={"bx": 64, "layout": "row", "alpha": 0.5, "unroll": True},
            status=Status.OK,
            objective=812.5,
            times_ms=(0.25, 0.26, 0.24),
            compile_time_ms=310.0,
            benchmark_time_ms=12.5,
            registers=40,
            shared_bytes=8192,
            local_bytes=0,
            threads_per_block=64,
            verification_error=1e-7,
            counters={"dram__bytes.sum": 1.5e9, "sm__throughput.pct": 71.0},
        ),
        Result(
            config={"bx": 128, "layout": "col", "alpha": 0.25, "unroll": False},
            status=Status.RESOURCE,
            compile_time_ms=290.0,
            registers=255,
            error="too many resources requested for launch",
        ),
        Result(
            config={"bx": 32, "layout": "row", "alpha": 1.0, "unroll": False},
            status=Status.CORRECTNESS,
            times_ms=(0.5,),
            verification_error=0.3,
            error="outputs differ from the reference",
        ),
        Result(
            config={"bx": 32, "layout": "col", "alpha": 1.0, "unroll": True},
            status=Status.OK,
            objective=900.0,
            times_ms=(0.2,),
        ),
    ]


@pytest.mark.parametrize("name", ["rec.json.gz", "rec.json"])
def test_a_recording_round_trips_every_field(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    results = _results()
    parameters = {
        "bx": [32, 64, 128],
        "layout": ["row", "col"],
        "alpha": [0.25, 0.5, 1.0],
        "unroll": [False, True],
    }
    device = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132}
    save_recording(
        path,
        results,
        parameters=parameters,
        kernel_name="gemm",
        device=device,
        problem_size={"M": 4096, "N": 4096},
        objective="GFLOP/s",
        direction="maximize",
        constraints=["bx * 2 <= 256"],
        metadata={"surrotune_version": "0.1.0"},
    )
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left behind

    dataset = load_dataset(path)
    assert dataset.format == "surrotune"
    assert list(dataset.results.values()) == results
    assert dataset.parameters == parameters
    assert (dataset.kernel_name, dataset.device_name) == ("gemm", "NVIDIA H200")
    assert dataset.problem_size == {"M": 4096, "N": 4096}
    assert (dataset.objective, dataset.direction) == ("GFLOP/s", "maximize")
    assert dataset.constraints == ("bx * 2 <= 256",)
    assert dataset.metadata == {"surrotune_version": "0.1.0", "device": device}
    assert dataset.optimum == results[3]
    assert ReplayBackend(dataset).device() == device


def test_a_recording_replaces_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    common = {
        "parameters": {"bx": [32, 64, 128], "layout": ["row", "col"]},
        "kernel_name": "k",
        "device": {"name": "gpu"},
        "problem_size": {},
        "objective": "time",
        "direction": "minimize",
    }
    save_recording(path, _results(), **common)  # type: ignore[arg-type]
    save_recording(path, _results()[:1], **common)  # type: ignore[arg-type]
    assert len(load_dataset(path).results) == 1
    with pytest.raises(ValueError, match="device"):
        save_recording(path, [], **common, metadata={"device": "x"})  # type: ignore[arg-type]


def test_numpy_values_are_written_as_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "np.json"
    result = Result(config={"bx": np.int64(64)}, status=Status.OK, objective=np.float64(1.5))
    save_recording(
        path,
        [result],
        parameters={"bx": list(np.array([32, 64]))},
        kernel_name="k",
        device={"name": "gpu"},
        problem_size={"n": np.int32(8)},
        objective="time",
        direction="minimize",
    )
    dataset = load_dataset(path)
    assert dataset.results == {"64": Result(config={"bx": 64}, status=Status.OK, objective=1.5)}
    assert dataset.problem_size == {"n": 8}


# ---------------------------------------------------------------------------- the backend


def test_replay_answers_recorded_results_and_accumulates_simulated_time(
    kt_datasets: Path,
) -> None:
    path = kt_datasets / CONV_A100
    raw = json.loads(_text(path))["cache"]
    dataset = load_dataset(path)
    backend = ReplayBackend(dataset)
    assert isinstance(backend, Backend) and isinstance(backend, DescribesDevice)
    assert backend.device()["name"] == "NVIDIA A100-PCIE-40GB"

    ok_key, failed_key = "16,1,1,1,0,0,0,1,15,15", "256,4,4,4,1,0,0,1,15,15"
    names = list(dataset.parameters)
    ok_config = dict(zip(names, map(int, ok_key.split(",")), strict=True))
    failed_config = dict(zip(names, map(int, failed_key.split(",")), strict=True))
    absent_config = {**ok_config, "block_size_x": 17}  # not a value of the space
    as_floats = {name: float(value) for name, value in ok_config.items()}
    as_numpy = {name: np.int64(value) for name, value in ok_config.items()}

    results = backend.evaluate([ok_config, failed_config, absent_config])
    results += backend.evaluate([as_floats, as_numpy])

    assert [r.status for r in results] == [Status.OK, Status.RESOURCE, Status.CONSTRAINT] + [
        Status.OK
    ] * 2
    assert results[0].objective == raw[ok_key]["time"]
    assert results[1].error == "RuntimeFailedConfig"
    assert str(path) in results[2].error and results[2].config == absent_config
    assert results[3].config is not as_floats and results[3].config == as_floats
    assert results[3].objective == results[4].objective == results[0].objective

    def cost(key: str) -> float:
        e = raw[key]
        return e["compile_time"] + e["verification_time"] + e["benchmark_time"]

    assert backend.simulated_time_ms == pytest.approx(3 * cost(ok_key) + cost(failed_key))
    assert backend.evaluations == 4
    backend.close()


def test_key_is_robust_to_numeric_spelling() -> None:
    dataset = Dataset(
        path=Path("mem.json"),
        format="surrotune",
        kernel_name="k",
        device_name="gpu",
        problem_size=None,
        parameters={"bx": [16, 32], "scale": [0.5, 1.5], "mode": ["a", "b"]},
        objective="time",
        direction="minimize",
        results={},
    )
    assert dataset.key({"bx": 16, "scale": 0.5, "mode": "a"}) == "16,0.5,a"
    assert dataset.key({"mode": "a", "bx": 16.0, "scale": np.float32(0.5), "extra": 1}) == (
        "16,0.5,a"
    )
    assert dataset.lookup({"bx": 16, "scale": 0.5, "mode": "a"}) is None
    with pytest.raises(KeyError, match="scale"):
        dataset.key({"bx": 16, "mode": "a"})
    with pytest.raises(DatasetError, match="no configuration has status ok"):
        _ = dataset.optimum
    assert dataclasses.replace(dataset, constraints=["bx > 0"]).constraints == ("bx > 0",)
