"""``surrotune counters``: a recording's counters, profiled in batches and kept across calls,
with a stand-in profiler (the real one runs in tests/counters/test_counters_gpu.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from surrotune.backends.replay import load_dataset
from surrotune.cli import main
from surrotune.counters.profiler import ProfileBatch
from surrotune.counters.record import (
    CountersRecordError,
    check_device,
    check_pairing,
    profile_recording,
    write_like,
)
from surrotune.experiment import load_experiment
from surrotune.result import ParamValue

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "experiments" / "gemm.toml"
GEMM_H200 = REPO / "experiments" / "datasets" / "gemm_h200.json.gz"


class StandIn:
    """Counters from the configuration itself; remembers what it was asked."""

    def __init__(
        self,
        *,
        disable_after: int | None = None,
        unlaunchable: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.disabled = ""
        self.asked: list[dict[str, ParamValue]] = []
        self.disable_after = disable_after
        self.unlaunchable = dict(unlaunchable) if unlaunchable is not None else None

    def profile(self, configs: Sequence[Mapping[str, ParamValue]]) -> ProfileBatch:
        self.asked.extend(dict(c) for c in configs)
        if self.disable_after is not None and len(self.asked) > self.disable_after:
            self.disabled = "counters are off: ERR_NVGPUCTRPERM (no permission)"
            return ProfileBatch([None] * len(configs), error=self.disabled)
        counters = [{"registers": float(c["TM"]) * 10, "sm_throughput": 50.0} for c in configs]
        if self.unlaunchable in [dict(c) for c in configs]:  # as the ncu target stops there
            at = [dict(c) for c in configs].index(self.unlaunchable)
            return ProfileBatch(
                [*counters[:at], *[None] * (len(configs) - at)],  # type: ignore[list-item]
                error="ncu profiled fewer launches",
                stopped_at=at,
            )
        return ProfileBatch(counters, seconds=0.01 * len(configs))  # type: ignore[arg-type]


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """30 configurations of the H200 GEMM recording (ok and failed), without counters."""
    dataset = load_dataset(GEMM_H200)
    keys = list(dataset.results)[:30]
    results = {k: dataclasses.replace(dataset.results[k], counters={}) for k in keys}
    path = tmp_path / "small.json.gz"
    write_like(dataset, results, path)
    return path


def test_every_ok_configuration_gets_counters_over_two_calls(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "with_counters.json.gz"
    ok = [r for r in load_dataset(small).results.values() if r.ok]
    assert 5 < len(ok) < 30  # the sample holds failures too
    first = StandIn()
    summary = profile_recording(small, out, first, batch_size=4, limit=5)
    assert summary.profiled == 5 and summary.already == 0 and summary.missing == len(ok) - 5
    assert len(first.asked) == 5
    second = StandIn()
    summary = profile_recording(small, out, second, batch_size=4)
    assert summary.already == 5 and summary.profiled == len(ok) - 5 and summary.missing == 0
    assert not {str(sorted(c.items())) for c in first.asked} & {
        str(sorted(c.items())) for c in second.asked
    }  # nothing profiled twice
    written = load_dataset(out)
    for result in written.results.values():
        if result.ok:
            assert result.counters["registers"] == float(result.config["TM"]) * 10
        else:
            assert not result.counters  # a failure has nothing to profile
    original = load_dataset(small)
    assert written.results.keys() == original.results.keys()
    assert all(
        written.results[k].times_ms == original.results[k].times_ms for k in original.results
    )
    assert "counters: " in summary.line() and "have none" in summary.line()


def test_counters_off_stops_with_the_reason_and_keeps_what_was_profiled(
    small: Path, tmp_path: Path
) -> None:
    out = tmp_path / "with_counters.json.gz"
    with pytest.raises(CountersRecordError, match="ERR_NVGPUCTRPERM"):
        profile_recording(small, out, StandIn(disable_after=4), batch_size=4)
    kept = [r for r in load_dataset(out).results.values() if r.counters]
    assert len(kept) == 4  # the first batch, written before the second failed


def test_a_configuration_that_cannot_launch_under_ncu_costs_only_itself(
    small: Path, tmp_path: Path
) -> None:
    ok = [r for r in load_dataset(small).results.values() if r.ok]
    out = tmp_path / "with_counters.json.gz"
    bad = dict(ok[1].config)  # in the first batch of 4, with ones after it
    profiler = StandIn(unlaunchable=bad)
    summary = profile_recording(small, out, profiler, batch_size=4)
    assert summary.unlaunchable == [bad]
    assert summary.profiled == len(ok) - 1 and summary.missing == 1
    assert profiler.asked.count(bad) == 1  # tried once, not again in this call
    missing = [r.config for r in load_dataset(out).results.values() if r.ok and not r.counters]
    assert missing == [bad]
    assert "1 of them failed to launch under ncu" in summary.line()


def test_a_recording_of_another_kernel_size_or_gpu_is_refused(tmp_path: Path) -> None:
    experiment = load_experiment(GEMM)
    dataset = load_dataset(GEMM_H200)
    check_pairing(experiment, dataset)
    check_device(dataset, "NVIDIA H200")  # the pair that belongs together
    with pytest.raises(CountersRecordError, match="this GPU is 'NVIDIA A100"):
        check_device(dataset, "NVIDIA A100-SXM4-80GB")
    other_size = dataclasses.replace(dataset, problem_size={**dataset.problem_size, "K": 4096})
    with pytest.raises(
        CountersRecordError, match=r"\[sizes\] differ .*K = 2048 \(recording: 4096"
    ):
        check_pairing(experiment, other_size)
    reduction = load_dataset(REPO / "experiments" / "datasets" / "reduction_h200.json.gz")
    with pytest.raises(CountersRecordError, match="parameters"):
        check_pairing(experiment, reduction)


def test_cli_refuses_a_mismatched_recording_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reduction = REPO / "experiments" / "datasets" / "reduction_h200.json.gz"
    code = main(["counters", str(GEMM), "--dataset", str(reduction), "-o", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err
    assert "reduction_h200.json.gz" in err and "parameters" in err
    assert not (tmp_path / "x").exists()


def test_cli_without_cupy_says_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the message for its absence cannot show")
    code = main(["counters", str(GEMM), "--dataset", str(GEMM_H200), "-o", str(tmp_path / "x")])
    assert code == 2
    assert "needs CuPy and an NVIDIA GPU" in capsys.readouterr().err
