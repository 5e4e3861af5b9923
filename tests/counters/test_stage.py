"""Profiling as the last stage of a run, with a profiler that needs no GPU: what is chosen, how
the budget bounds it, what is stored, and what the summary says."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.counters.policy import CountersPolicy
from surrotune.counters.profiler import ProfileBatch
from surrotune.counters.stage import FIRST_BATCH, profile_study, profiled_counters
from surrotune.finish import FinishSettings, finish_run, profiler_for
from surrotune.result import ParamValue
from surrotune.runner import Runner
from surrotune.sampling import make_sampler
from surrotune.space import SearchSpace

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "experiments" / "datasets" / "gemm_h200.json.gz"


class FakeProfiler:
    """Counters made up from the configuration; each configuration 'costs' ``cost`` seconds."""

    def __init__(self, cost: float = 2.0, disabled: str = "") -> None:
        self.cost = cost
        self.disabled = disabled
        self.batches: list[int] = []

    def profile(self, configs: list[dict[str, ParamValue]]) -> ProfileBatch:
        self.batches.append(len(configs))
        counters = [
            {"dram_throughput": 90.0 if c["VEC"] == 4 else 20.0, "achieved_occupancy": 50.0,
             "sm_throughput": 30.0}
            for c in configs
        ]  # fmt: skip
        return ProfileBatch(counters, seconds=self.cost * len(configs))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def study() -> optuna.Study:
    """60 trials of the H200 GEMM recording, replayed."""
    dataset = load_dataset(GEMM)
    space = SearchSpace(dataset.parameters)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler("random", space, seed=3))
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=60).run()
    return study


def _copy(study: optuna.Study) -> optuna.Study:
    copy = optuna.create_study(direction=study.direction)
    copy.add_trials(study.get_trials())
    return copy


def test_elite_profiles_the_best_and_stores_counters_with_a_diagnosis(study: optuna.Study) -> None:
    target = _copy(study)
    profiler = FakeProfiler(cost=1.0)
    lines = profile_study(
        target, profiler, CountersPolicy(mode="elite", elite=3), run_wall_s=1000.0
    )
    stored = profiled_counters(target)
    best = sorted(
        (t for t in target.trials if t.value is not None), key=lambda t: t.value
    )[:3]  # fmt: skip
    assert sorted(stored) == sorted(t.number for t in best)
    entry = stored[best[0].number]
    assert entry["reason"] == "elite: rank 1" and set(entry["counters"]) >= {"dram_throughput"}
    assert entry["diagnosis"]["label"] in ("memory-bound", "latency-bound")
    assert lines and lines[0].startswith("Counters: 3 configurations profiled with ncu (elite)")
    # a second pass profiles nothing again
    assert (
        profile_study(target, profiler, CountersPolicy(mode="elite", elite=3), run_wall_s=1e3)
        == []
    )


def test_the_budget_bounds_what_is_profiled_after_the_first_batch(study: optuna.Study) -> None:
    target = _copy(study)
    profiler = FakeProfiler(cost=2.0)
    # 10 % of 100 s = 10 s: the first batch (4 x 2 s) leaves 2 s, one more configuration
    profile_study(target, profiler, CountersPolicy(mode="all", budget_share=0.1), run_wall_s=100)
    assert profiler.batches == [FIRST_BATCH, 1]
    assert len(profiled_counters(target)) == FIRST_BATCH + 1


class StopsAtSecond(FakeProfiler):
    """The ncu target stops at the first batch's second launch, as after a failed launch."""

    def profile(self, configs: list[dict[str, ParamValue]]) -> ProfileBatch:
        batch = super().profile(configs)
        if len(self.batches) == 1 and len(configs) > 2:
            batch.counters[1:] = [None] * (len(configs) - 1)
            batch.stopped_at, batch.error = 1, "ncu profiled 1 of 4 launches"
        return batch


def test_a_launch_that_fails_under_ncu_costs_that_configuration_only(
    study: optuna.Study,
) -> None:
    target = _copy(study)
    profiler = StopsAtSecond(cost=1.0)
    profile_study(target, profiler, CountersPolicy(mode="elite", elite=5), run_wall_s=1000.0)
    best = sorted((t for t in target.trials if t.value is not None), key=lambda t: t.value)[:5]
    # the 2nd best stopped the first run; the 3rd and 4th went into the next run with the 5th
    assert profiler.batches == [FIRST_BATCH, 3]
    assert sorted(profiled_counters(target)) == sorted(
        t.number for i, t in enumerate(best) if i != 1
    )


def test_counters_off_is_said_once_and_nothing_is_stored(study: optuna.Study) -> None:
    target = _copy(study)
    profiler = FakeProfiler(disabled="counters are off: this user may not read the counters")
    lines = profile_study(target, profiler, CountersPolicy(mode="all"), run_wall_s=100.0)
    assert lines == ["Counters are off: this user may not read the counters"]
    assert profiled_counters(target) == {} and profiler.batches == []


def test_finish_profiles_only_where_a_gpu_ran(study: optuna.Study, tmp_path: Path) -> None:
    replay = ReplayBackend(load_dataset(GEMM))
    assert profiler_for(replay, tmp_path) is None  # nothing runs on a GPU: nothing to profile
    target = _copy(study)
    lines = finish_run(
        target, replay, FinishSettings(sanitize="none", remeasure_top=0), report_dir=tmp_path,
        counters=CountersPolicy(mode="elite"), run_wall_s=100.0,
    )  # fmt: skip
    assert lines == [] and profiled_counters(target) == {}
    lines = finish_run(
        target, replay, FinishSettings(sanitize="none", remeasure_top=0), report_dir=tmp_path,
        counters=CountersPolicy(mode="elite", elite=2), profiler=FakeProfiler(), run_wall_s=1e3,
    )  # fmt: skip
    assert len(profiled_counters(target)) == 2 and "profiled with ncu" in lines[0]


def test_profiled_counters_travel_into_exported_results(study: optuna.Study) -> None:
    from surrotune.analysis.export import measured_trials

    target = optuna.create_study(direction=study.direction)
    for trial in study.get_trials():  # as a live run stores them: no counters on the trial
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k != "counters"}
        target.add_trial(trial)
    profile_study(target, FakeProfiler(cost=1.0), CountersPolicy(mode="elite", elite=3),
                  run_wall_s=1e3)  # fmt: skip
    stored = profiled_counters(target)
    results = {t.number: r for t, r in measured_trials(target)}
    for number, result in results.items():
        if number in stored:
            assert dict(result.counters) == stored[number]["counters"]
        else:
            assert not result.counters
    assert len(stored) == 3
