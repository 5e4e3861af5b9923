"""Counters without a GPU: ncu's CSV, the counter names, the diagnosis, the policy's choices,
and a whole profiling batch through a stand-in ncu (tests/counters/fake_ncu.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from surrotune.backends.sanitize import SanitizeJob
from surrotune.counters import profiler as profiler_module
from surrotune.counters.diagnosis import diagnose
from surrotune.counters.metrics import COUNTERS, counters_from_metrics, ncu_metrics
from surrotune.counters.ncu import ncu_command, ncu_failure, parse_ncu_csv
from surrotune.counters.policy import PREDICTION_ATTR, CountersMode, CountersPolicy
from surrotune.counters.profiler import NcuProfiler

HERE = Path(__file__).resolve().parent
FAKE_NCU = HERE / "fake_ncu.py"

FIXTURES = HERE.parent / "fixtures" / "ncu"
#: ncu's two CSV layouts, written by hand after its documented format (README.md there)
DETAILS = (FIXTURES / "details_handwritten.csv").read_text()
RAW = (FIXTURES / "raw_handwritten.csv").read_text()


def test_details_page_groups_rows_by_launch() -> None:
    launches = parse_ncu_csv(DETAILS)
    assert [launch.launch_id for launch in launches] == [0, 1]
    first, second = launches
    assert first.kernel_name == "gemm" and first.block == "(256, 1, 1)"
    assert first.metrics["dram__bytes_read.sum"] == 50_331_648  # thousands separators
    assert first.metrics["l1tex__t_sector_hit_rate.pct"] is None  # n/a
    assert first.units["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
    assert second.metrics == {
        "dram__bytes_read.sum": 1234.5,
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 80.0,
    }


def test_raw_page_reads_a_column_per_metric_and_the_units_row() -> None:
    vadd, smem = parse_ncu_csv(RAW)
    assert vadd.kernel_name == "vadd" and vadd.metrics["gpu__time_duration.sum"] == 12_800
    assert vadd.units["dram__bytes_read.sum"] == "byte"
    assert smem.metrics == {"dram__bytes_read.sum": 16_777_216, "gpu__time_duration.sum": None}


#: real output of ncu 2025.3.1 on the H200 (capture.sh): vadd, smem (bank conflicts), vadd
H200_DETAILS = (FIXTURES / "ncu_details_h200.csv").read_text()
#: the same three kernels, raw page, profiled from the start (CuPy's random fills come first)
H200_RAW = (FIXTURES / "ncu_raw_h200.csv").read_text()


def test_real_h200_details_page_gives_every_counter_of_each_launch() -> None:
    launches = parse_ncu_csv(H200_DETAILS)
    assert [launch.kernel_name for launch in launches] == ["vadd", "smem", "vadd"]
    names = {c.name for c in COUNTERS} - {"shared_requests"}  # not in capture.sh's list
    for launch in launches:
        counters = counters_from_metrics(launch.metrics)
        assert set(counters) == names
        assert counters["registers"] == 16
        assert 0 < counters["achieved_occupancy"] <= 100
    vadd, smem, _ = (counters_from_metrics(launch.metrics) for launch in launches)
    # vadd reads two float32 arrays of 2**22 elements: 32 MiB from DRAM, to a few sectors
    assert launches[0].metrics["dram__bytes_read.sum"] == pytest.approx(2 * 4 * 2**22, rel=1e-3)
    assert launches[0].units["dram__bytes_read.sum"] == "byte"
    # the transposed read of a [32][33] tile conflicts on shared-memory banks; vadd has none
    assert smem["shared_bank_conflicts"] > 0 and vadd["shared_bank_conflicts"] == 0
    assert vadd["stall_long_scoreboard"] > vadd["stall_barrier"]  # waiting on DRAM, no barrier
    assert diagnose(vadd).label is not None


def test_real_h200_raw_page_agrees_with_the_details_page() -> None:
    raw = parse_ncu_csv(H200_RAW)
    assert len(raw) == 8 and [launch.kernel_name for launch in raw[-3:]] == [
        "vadd",
        "smem",
        "vadd",
    ]
    details = [counters_from_metrics(launch.metrics) for launch in parse_ncu_csv(H200_DETAILS)]
    for one, other in zip(
        details, (counters_from_metrics(x.metrics) for x in raw[-3:]), strict=True
    ):
        assert set(one) == set(other)
        assert one["registers"] == other["registers"]
        # two runs of the same kernels: rates agree to a few percent
        assert one["achieved_occupancy"] == pytest.approx(other["achieved_occupancy"], rel=0.05)
        assert one["dram_bytes"] == pytest.approx(other["dram_bytes"], rel=0.05)


def test_text_without_a_table_is_refused() -> None:
    with pytest.raises(ValueError, match="no ncu CSV header"):
        parse_ncu_csv("==PROF== Disconnected from process 1\n")


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "ERR_NVGPUCTRPERM"),
        ("==ERROR== Failed to find metric sm__bogus.sum", "does not know the metric sm__bogus"),
        ("==WARNING== No kernels were profiled.", "profiled no kernel"),
        ("==PROF== Disconnected from process 1", None),
    ],
)
def test_ncu_failures_are_named(output: str, expected: str | None) -> None:
    reason = ncu_failure(output)
    assert reason is None if expected is None else expected in (reason or "")


def test_the_command_profiles_only_the_targets_range_to_a_csv_file(tmp_path: Path) -> None:
    command = ncu_command("ncu", ["a.sum", "b.pct"], tmp_path / "x.csv", ["python", "t.py"])
    assert command[0] == "ncu" and command[-2:] == ["python", "t.py"]
    options = {word: command[i + 1] for i, word in enumerate(command) if word.startswith("--")}
    assert options["--metrics"] == "a.sum,b.pct"
    assert options["--log-file"] == str(tmp_path / "x.csv")
    assert options["--profile-from-start"] == "off" and options["--print-units"] == "base"
    assert "--csv" in command


def test_counters_sum_their_metrics_and_skip_what_is_missing() -> None:
    names = ncu_metrics()
    assert len(names) == len(set(names)) and "launch__registers_per_thread" in names
    metrics = {
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": 100.0,
        "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": None,
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 91.0,
    }
    counters = counters_from_metrics(metrics)
    assert counters == {"local_bytes": 100.0, "dram_throughput": 91.0}
    assert {c.name for c in COUNTERS} >= {
        "achieved_occupancy", "sm_throughput", "dram_throughput", "l1_hit_rate", "l2_hit_rate",
        "shared_bank_conflicts", "local_bytes", "registers", "stall_long_scoreboard",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("counters", "label", "words"),
    [
        ({"dram_throughput": 92.0, "sm_throughput": 30.0, "achieved_occupancy": 80.0},
         "memory-bound", "DRAM roof"),
        ({"local_bytes": 5e7, "dram_bytes": 1e8, "registers": 255.0, "dram_throughput": 20.0},
         "register-spills", "255 registers"),
        ({"shared_bank_conflicts": 6e6, "shared_requests": 8e6, "dram_throughput": 10.0},
         "bank-conflicts", "0.75 extra wavefronts"),
        ({"achieved_occupancy": 12.0, "sm_throughput": 20.0, "dram_throughput": 15.0,
          "memory_throughput": 25.0}, "occupancy-limited", "12 % of the warp slots"),
        ({"sm_throughput": 85.0, "dram_throughput": 10.0, "achieved_occupancy": 60.0},
         "compute-bound", "85 %"),
        ({"sm_throughput": 30.0, "dram_throughput": 20.0, "achieved_occupancy": 60.0,
          "stall_long_scoreboard": 9.5, "stall_barrier": 2.0, "stall_not_selected": 20.0},
         "latency-bound", "long scoreboard"),
    ],
)  # fmt: skip
def test_diagnosis_names_the_first_limit(
    counters: dict[str, float], label: str, words: str
) -> None:
    found = diagnose(counters)
    assert found.label == label, found.summary()
    assert words in found.summary()
    assert found.to_attrs()["label"] == label


def test_diagnosis_lists_every_finding_most_decisive_first() -> None:
    found = diagnose({"dram_throughput": 88.0, "local_bytes": 4e6, "dram_bytes": 1e8})
    assert found.labels == ("memory-bound", "register-spills")
    assert diagnose({}).label == "" and diagnose({}).summary() == "no counters to read"


def _trial(number: int, value: float | None, *, predicted: float | None = None, **attrs: Any):
    trial = create_trial(
        params={"x": number}, distributions={"x": IntDistribution(0, 1000)},
        value=value, state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
        user_attrs={"status": "ok" if value is not None else "resource", **attrs},
        system_attrs={PREDICTION_ATTR: predicted} if predicted is not None else {},
    )  # fmt: skip
    trial.number = number
    return trial


def test_policy_elite_failures_all_none() -> None:
    trials = [
        _trial(0, 1.0), _trial(1, 1.1), _trial(2, 5.0), _trial(3, 1.2, predicted=0.5),
        _trial(4, None), _trial(5, 2.5), _trial(6, 1.05, duplicate_of=0),
    ]  # fmt: skip
    elite = CountersPolicy(mode="elite", elite=3).choose(trials)
    assert [c.number for c in elite] == [0, 1, 3]
    failures = CountersPolicy(mode=CountersMode.FAILURES).choose(trials)
    # the surprise (2.4x its prediction) first, then the furthest behind the best
    assert [c.number for c in failures] == [3, 2, 5]
    assert "worse than predicted" in failures[0].reason and "than the best" in failures[1].reason
    everything = CountersPolicy(mode="all").choose(trials, already={0}, limit=3)
    assert [c.number for c in everything] == [1, 3, 5]
    assert CountersPolicy().choose(trials) == []


def test_policy_for_a_maximised_objective_and_its_budget() -> None:
    trials = [_trial(0, 100.0), _trial(1, 40.0), _trial(2, 90.0)]  # GB/s: higher is better
    policy = CountersPolicy(mode="failures", behind_best=2.0, budget_share=0.1)
    assert [c.number for c in policy.choose(trials, minimize=False)] == [1]
    assert policy.budget(600.0, 2.0) == 30 and policy.budget(600.0, None) is None
    with pytest.raises(ValueError, match="budget_share"):
        CountersPolicy(mode="all", budget_share=0.0)


# --------------------------------------------------------------------------- one batch


@pytest.fixture
def fake_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each configuration becomes a job without compiling (no GPU, no template)."""

    def rebuild(backend: Any, config: dict[str, int]) -> SanitizeJob:
        if config["x"] < 0:
            raise ValueError("no launch geometry")
        return SanitizeJob(None, b"", f"k{config['x']}", (1, 1, 1), (32, 1, 1), 0)  # type: ignore[arg-type]

    def rebuild_all(backend: Any, configs: list[dict[str, int]]) -> list[Any]:
        jobs: list[Any] = []
        for config in configs:
            try:
                jobs.append(rebuild(backend, config))
            except ValueError as error:
                jobs.append(error)
        return jobs

    import surrotune.backends.sanitize as sanitize

    monkeypatch.setattr(sanitize, "rebuild_launches", rebuild_all)


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in ncu is a Python script")
def test_a_batch_is_profiled_by_one_ncu_process(
    fake_launches: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_NCU_MODE", raising=False)
    profiler = NcuProfiler(object(), executable=str(FAKE_NCU), report_dir=tmp_path / "ncu")  # type: ignore[arg-type]
    batch = profiler.profile([{"x": 1}, {"x": -1}, {"x": 2}])
    assert batch.error == "" and batch.profiled == 2 and profiler.batches == 1
    first, missing, third = batch.counters
    assert missing is None  # no launch could be rebuilt for it
    assert first is not None and third is not None
    assert first["dram_throughput"] != third["dram_throughput"]  # launch order kept
    assert batch.seconds_per_config is not None and batch.seconds_per_config > 0
    assert (tmp_path / "ncu" / "ncu-batch-1.csv").read_text().startswith('"ID"')


def test_no_permission_turns_counters_off_once_with_the_reason(
    fake_launches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NCU_MODE", "noperm")
    profiler = NcuProfiler(object(), executable=str(FAKE_NCU))  # type: ignore[arg-type]
    batch = profiler.profile([{"x": 1}])
    assert batch.profiled == 0 and "ERR_NVGPUCTRPERM" in batch.error
    assert profiler.disabled.startswith("counters are off:")
    again = profiler.profile([{"x": 2}])  # not retried: the reason holds for every batch
    assert again.counters == [None] and profiler.batches == 1


@pytest.mark.parametrize(
    "mode",
    [
        "short",  # the run ended at the second launch, which ncu did not list
        # as seen on the H200: ncu lists the failed launch with every metric n/a, then the
        # target stops; blaming the next (never launched) one lost its counters for good
        "failed",
    ],
)
def test_a_profile_that_stops_blames_the_launch_that_failed(
    fake_launches: None, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The launches before it keep their counters, the failed one is the suspect, the rest
    were never tried."""
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    profiler = NcuProfiler(object(), executable=str(FAKE_NCU))  # type: ignore[arg-type]
    batch = profiler.profile([{"x": 1}, {"x": 2}, {"x": 3}])
    assert batch.counters[0] is not None and batch.counters[1:] == [None, None]
    assert batch.stopped_at == 1 and batch.not_launched() == [2]
    assert batch.error == "ncu profiled 1 of 3 launches: the launch of x=2 failed under ncu"


def test_without_ncu_nothing_is_profiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiler_module, "find_ncu", lambda: None)
    profiler = NcuProfiler(object())  # type: ignore[arg-type]
    assert profiler.disabled == "ncu (Nsight Compute) was not found"
    assert profiler.profile([{"x": 1}]).counters == [None]
