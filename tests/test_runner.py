"""The runner on the replay backend: budget, constraints, duplicates, interrupt and resume."""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest
from optuna.trial import TrialState

from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.result import ParamValue, Result, Status
from surrotune.runner import Runner, batches_ahead, read_study
from surrotune.sampling import make_sampler
from surrotune.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


def write_kt_cache(path: Path) -> Path:
    """A small Kernel Tuner cache: 4 x 4 x 2 = 32 configurations, with failures.

    Time is smallest at bx=64, by=4, u=1 (1.0 ms); bx*by >= 1024 fails at runtime (resource);
    bx=8 with u=1 fails to compile.
    """
    params = {"bx": [8, 16, 32, 64], "by": [1, 2, 4, 16], "u": [0, 1]}
    cache = {}
    for bx, by, u in itertools.product(*params.values()):
        key = f"{bx},{by},{u}"
        entry: dict[str, object] = {"bx": bx, "by": by, "u": u, "compile_time": 500.0,
                                    "verification_time": 0, "benchmark_time": 20.0}  # fmt: skip
        if bx * by >= 1024:
            entry["time"] = "RuntimeFailedConfig"
        elif bx == 8 and u == 1:
            entry["time"] = "CompilationFailedConfig"
        else:
            t = 1.0 + abs(bx - 64) / 16 + abs(by - 4) / 2 + (1 - u) * 0.5
            entry["time"] = t
            entry["times"] = [t, t * 1.01, t * 0.99]
        cache[key] = entry
    return write_kt_doc(path, params, cache)


def write_kt_doc(path: Path, params: Mapping[str, list], cache: Mapping[str, dict]) -> Path:
    """A Kernel Tuner cache file of ``cache`` (key -> entry) over the tunable ``params``."""
    doc = {
        "device_name": "Test GPU", "kernel_name": "k", "problem_size": [1024],
        "tune_params_keys": list(params), "tune_params": dict(params), "objective": "time",
        "cache": dict(cache),
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_kt_cache(tmp_path / "tiny.json")


class SpyBackend:
    """Wraps a backend; records what reached it and can act on a chosen batch."""

    def __init__(self, inner: ReplayBackend, on_batch: dict[int, str] | None = None) -> None:
        self.inner = inner
        self.on_batch = on_batch or {}
        self.batches: list[list[dict[str, ParamValue]]] = []

    @property
    def simulated_time_ms(self) -> float:
        return self.inner.simulated_time_ms

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
        self.batches.append([dict(c) for c in configs])
        action = self.on_batch.get(len(self.batches))
        if action == "sigint":  # the user presses Ctrl-C once while this batch runs
            os.kill(os.getpid(), signal.SIGINT)
        if action == "raise":  # the user presses Ctrl-C twice: the batch never finishes
            raise KeyboardInterrupt
        return self.inner.evaluate(configs)

    def close(self) -> None:
        self.inner.close()


def make_runner(
    path: Path, storage: str, *, trials: int, sampler: str = "random", seed: int = 0,
    constraints: Sequence[str] = (), batch_size: int = 4, on_batch: dict[int, str] | None = None,
) -> tuple[Runner, SpyBackend]:  # fmt: skip
    dataset = load_dataset(path)
    space = SearchSpace(dataset.parameters, constraints)
    study = optuna.create_study(
        storage=storage, study_name="s", direction="minimize", load_if_exists=True,
        sampler=make_sampler(sampler, space, seed=seed),
    )  # fmt: skip
    backend = SpyBackend(ReplayBackend(dataset), on_batch)
    runner = Runner(
        study=study, space=space, backend=backend, trials=trials, batch_size=batch_size
    )
    return runner, backend


def measured_keys(study: optuna.Study) -> list[str]:
    return [
        t.user_attrs["config_key"] for t in study.get_trials()
        if "status" in t.user_attrs and "duplicate_of" not in t.user_attrs
        and not t.user_attrs.get("interrupted")
    ]  # fmt: skip


def test_budget_statuses_and_values_match_the_recording(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_runner(tiny, storage, trials=20, sampler="random", seed=1)
    summary = runner.run()
    assert summary.evaluations == 20 and summary.stop_reason == "budget"
    dataset = load_dataset(tiny)
    study = runner.study
    keys = measured_keys(study)
    assert len(keys) == len(set(keys)) == 20
    for trial in study.get_trials():
        if "duplicate_of" in trial.user_attrs:
            continue
        recorded = dataset.lookup(trial.params)
        assert recorded is not None
        assert trial.user_attrs["status"] == recorded.status.value
        if recorded.ok:
            assert trial.state == TrialState.COMPLETE and trial.value == recorded.objective
        else:
            assert trial.state == TrialState.FAIL
    # everything that reached the backend was new
    sent = [dataset.key(c) for batch in backend.batches for c in batch]
    assert len(sent) == len(set(sent)) == 20
    assert summary.simulated_time_ms == pytest.approx(20 * 520.0, rel=0.2)


def test_constraint_proposals_are_recorded_but_cost_nothing(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_runner(tiny, storage, trials=6, constraints=["bx * by <= 64"])
    summary = runner.run()
    states = read_study(runner.study, runner.space)
    assert summary.evaluations == 6
    assert states.counts[Status.CONSTRAINT] > 0  # random proposes infeasible configurations
    sent = [c for batch in backend.batches for c in batch]
    assert all(c["bx"] * c["by"] <= 64 for c in sent)
    broken = [t for t in runner.study.get_trials() if t.user_attrs["status"] == "constraint"]
    assert all("bx * by <= 64" in t.user_attrs["error"] for t in broken)


def test_brute_force_visits_the_feasible_set_once(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _ = make_runner(
        tiny, storage, trials=1000, sampler="brute-force", constraints=["bx >= 16"]
    )
    summary = runner.run()
    assert summary.stop_reason == "exhausted"
    assert summary.evaluations == 24  # 3 x 4 x 2 configurations with bx >= 16
    assert summary.best is not None and summary.best.params == {"bx": 64, "by": 4, "u": 1}
    assert summary.counts[Status.RESOURCE] == 2 and Status.CONSTRAINT not in summary.counts


def test_resume_continues_without_loss_or_repeat(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first, _ = make_runner(tiny, storage, trials=10, sampler="brute-force", seed=3)
    assert first.run().evaluations == 10
    before = measured_keys(first.study)
    second, backend = make_runner(tiny, storage, trials=25, sampler="brute-force", seed=3)
    summary = second.run()
    assert summary.evaluations == 25 and summary.new_evaluations == 15
    after = measured_keys(second.study)
    assert after[:10] == before and len(set(after)) == 25
    assert not {second.space.key(c) for b in backend.batches for c in b} & set(before)


def test_first_ctrl_c_finishes_the_batch_then_stops(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _ = make_runner(
        tiny, storage, trials=30, sampler="brute-force", batch_size=4, on_batch={2: "sigint"}
    )
    summary = runner.run()
    assert summary.interrupted and summary.evaluations == 8  # both batches recorded
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed, _ = make_runner(tiny, storage, trials=30, sampler="brute-force")
    assert resumed.run().evaluations == 30
    keys = measured_keys(resumed.study)
    assert len(keys) == len(set(keys)) == 30


def test_second_ctrl_c_marks_the_batch_interrupted_and_resume_redoes_it(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _backend = make_runner(
        tiny, storage, trials=20, sampler="brute-force", seed=5, on_batch={3: "raise"}
    )
    summary = runner.run()
    assert summary.interrupted and summary.evaluations == 8
    cut = [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]
    assert len(cut) == 4 and all(t.state == TrialState.FAIL for t in cut)
    assert all("status" not in t.user_attrs for t in cut)
    cut_keys = {runner.space.key(t.params) for t in cut}

    resumed, backend2 = make_runner(tiny, storage, trials=20, sampler="brute-force", seed=6)
    assert resumed.run().evaluations == 20
    first_batch = {resumed.space.key(c) for c in backend2.batches[0]}
    assert cut_keys <= first_batch  # the cut-short configurations are measured first
    keys = measured_keys(resumed.study)
    assert len(keys) == len(set(keys)) == 20
    assert cut_keys <= set(keys)


def test_duplicates_are_answered_from_the_study(tiny: Path, tmp_path: Path) -> None:
    # a 2-configuration space forces the random sampler to repeat itself
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_runner(
        tiny, storage, trials=2, constraints=["bx == 64 and by == 4"], batch_size=8
    )
    summary = runner.run()
    assert summary.evaluations == 2
    sent = [runner.space.key(c) for b in backend.batches for c in b]
    assert sorted(sent) == ["64,4,0", "64,4,1"]
    dups = [t for t in runner.study.get_trials() if "duplicate_of" in t.user_attrs]
    for trial in dups:
        first = runner.study.trials[trial.user_attrs["duplicate_of"]]
        assert first.params == trial.params and first.value == trial.value


# --------------------------------------------------------------------------- pipelining


class PreparingSpy(SpyBackend):
    """A backend that prepares: records every prepare and evaluate call, in order."""

    def __init__(self, inner: ReplayBackend, on_batch: dict[int, str] | None = None) -> None:
        super().__init__(inner, on_batch)
        self.calls: list[tuple[str, list[str]]] = []

    def _keys(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[str]:
        return [self.inner.dataset.key(c) for c in configs]

    def prepare(self, configs: Sequence[Mapping[str, ParamValue]]) -> None:
        self.calls.append(("prepare", self._keys(configs)))

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
        self.calls.append(("evaluate", self._keys(configs)))
        return super().evaluate(configs)


def make_pipelined(
    path: Path, storage: str, *, trials: int, sampler: str = "brute-force", seed: int = 0,
    constraints: Sequence[str] = (), batch_size: int = 4, on_batch: dict[int, str] | None = None,
    ask_ahead: int = 1,
) -> tuple[Runner, PreparingSpy]:  # fmt: skip
    runner, spy = make_runner(
        path, storage, trials=trials, sampler=sampler, seed=seed, constraints=constraints,
        batch_size=batch_size,
    )  # fmt: skip
    backend = PreparingSpy(spy.inner, on_batch)
    runner = Runner(
        study=runner.study, space=runner.space, backend=backend, trials=trials,
        batch_size=batch_size, ask_ahead=ask_ahead,
    )  # fmt: skip
    return runner, backend


def test_the_next_batch_is_prepared_before_the_current_is_evaluated(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_pipelined(tiny, storage, trials=10, batch_size=4)
    summary = runner.run()
    assert summary.evaluations == 10 and summary.stop_reason == "budget"
    kinds = [kind for kind, _ in backend.calls]
    # batch 2 is asked and prepared before batch 1 is evaluated; the budget leaves 2 for batch 3
    assert kinds == ["prepare", "prepare", "evaluate", "prepare", "evaluate", "evaluate"]
    prepared = [keys for kind, keys in backend.calls if kind == "prepare"]
    evaluated = [keys for kind, keys in backend.calls if kind == "evaluate"]
    assert prepared == evaluated  # each batch exactly as it was prepared
    assert [len(keys) for keys in evaluated] == [4, 4, 2]
    keys = measured_keys(runner.study)
    assert len(keys) == len(set(keys)) == 10
    assert not [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]


def test_two_batches_ahead_are_prepared_in_order_and_each_measured_once(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_pipelined(tiny, storage, trials=14, batch_size=4, ask_ahead=2)
    summary = runner.run()
    assert summary.evaluations == 14 and summary.stop_reason == "budget"
    kinds = [kind for kind, _ in backend.calls]
    # batches 2 and 3 are prepared before batch 1 is evaluated; the budget leaves 2 for batch 4
    assert kinds == [
        "prepare", "prepare", "prepare", "evaluate", "prepare", "evaluate", "evaluate", "evaluate"
    ]  # fmt: skip
    prepared = [keys for kind, keys in backend.calls if kind == "prepare"]
    evaluated = [keys for kind, keys in backend.calls if kind == "evaluate"]
    assert prepared == evaluated and [len(k) for k in evaluated] == [4, 4, 4, 2]
    keys = measured_keys(runner.study)
    assert len(keys) == len(set(keys)) == 14
    assert not [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]


def test_a_repeat_two_batches_ahead_waits_for_the_batch_that_measures_it(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_pipelined(tiny, storage, trials=8, batch_size=3, ask_ahead=2)
    first = [{"bx": bx, "by": 4, "u": 1} for bx in (16, 32, 64)]
    second = [{"bx": bx, "by": 2, "u": 1} for bx in (16, 32, 64)]
    # batch 3 (asked while batch 1 runs and batch 2 is prepared) repeats one of each
    third = [second[1], first[0], {"bx": 8, "by": 2, "u": 0}]
    for params in [*first, *second, *third, {"bx": 8, "by": 4, "u": 0}]:
        runner.study.enqueue_trial(params, skip_if_exists=False)
    summary = runner.run()
    sent = [key for kind, keys in backend.calls if kind == "evaluate" for key in keys]
    assert len(sent) == len(set(sent)) == summary.evaluations == 8
    repeated = [t for t in runner.study.get_trials()[6:9] if "duplicate_of" in t.user_attrs]
    assert [t.params for t in repeated] == [second[1], first[0]]
    for trial in repeated:
        source = runner.study.trials[trial.user_attrs["duplicate_of"]]
        assert source.params == trial.params and source.value == trial.value


def test_ctrl_c_redoes_every_batch_prepared_ahead(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _ = make_pipelined(
        tiny, storage, trials=30, batch_size=4, on_batch={2: "sigint"}, ask_ahead=2
    )
    summary = runner.run()
    assert summary.interrupted and summary.evaluations == 8  # batches 1 and 2 are recorded
    cut = [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]
    assert len(cut) == 8 and all(t.state == TrialState.FAIL for t in cut)  # batches 3 and 4
    assert all("status" not in t.user_attrs for t in cut)


def test_look_ahead_stops_at_the_end_of_the_feasible_space(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_pipelined(
        tiny, storage, trials=1000, constraints=["bx >= 16"], batch_size=5
    )
    summary = runner.run()
    assert summary.stop_reason == "exhausted" and summary.evaluations == 24
    evaluated = [keys for kind, keys in backend.calls if kind == "evaluate"]
    assert sum(len(keys) for keys in evaluated) == 24
    assert runner.study.trials and all(
        t.state.is_finished() and not t.user_attrs.get("interrupted") for t in runner.study.trials
    )


def test_a_repeat_of_a_configuration_in_flight_waits_for_its_result(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, backend = make_pipelined(tiny, storage, trials=7, batch_size=4)
    configs = [{"bx": bx, "by": 4, "u": 1} for bx in (16, 32, 64, 8)]
    # batch 1 measures the four; batch 2 (asked while batch 1 runs) repeats two of them
    for params in [*configs, configs[2], {"bx": 64, "by": 2, "u": 1}, configs[0],
                   {"bx": 16, "by": 2, "u": 0}]:  # fmt: skip
        runner.study.enqueue_trial(params, skip_if_exists=False)
    summary = runner.run()
    assert summary.evaluations == 7 and summary.duplicates >= 2
    sent = [key for kind, keys in backend.calls if kind == "evaluate" for key in keys]
    assert len(sent) == len(set(sent)) == 7
    trials = runner.study.get_trials()
    for trial in trials:
        if "duplicate_of" in trial.user_attrs:
            first = runner.study.trials[trial.user_attrs["duplicate_of"]]
            assert first.params == trial.params and "duplicate_of" not in first.user_attrs
            assert first.user_attrs["status"] == trial.user_attrs["status"]
            assert first.value == trial.value
    repeated = [t for t in trials[4:8] if "duplicate_of" in t.user_attrs]
    assert [t.params for t in repeated] == [configs[2], configs[0]]


def test_first_ctrl_c_records_the_batch_in_flight_and_redoes_the_prepared_one(
    tiny: Path, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _ = make_pipelined(tiny, storage, trials=30, batch_size=4, on_batch={2: "sigint"})
    summary = runner.run()
    assert summary.interrupted and summary.evaluations == 8  # batches 1 and 2 are recorded
    cut = [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]
    assert len(cut) == 4 and all(t.state == TrialState.FAIL for t in cut)  # batch 3, prepared
    assert all("status" not in t.user_attrs for t in cut)
    cut_keys = {runner.space.key(t.params) for t in cut}

    resumed, backend = make_pipelined(tiny, storage, trials=30, batch_size=4)
    assert resumed.run().evaluations == 30
    first = next(keys for kind, keys in backend.calls if kind == "evaluate")
    assert cut_keys == set(first)  # measured first, as any cut-short trial
    keys = measured_keys(resumed.study)
    assert len(keys) == len(set(keys)) == 30


def test_second_ctrl_c_marks_both_batches_interrupted(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner, _ = make_pipelined(tiny, storage, trials=20, batch_size=4, on_batch={2: "raise"})
    summary = runner.run()
    assert summary.interrupted and summary.evaluations == 4
    cut = [t for t in runner.study.get_trials() if t.user_attrs.get("interrupted")]
    assert len(cut) == 8  # the batch being evaluated and the one prepared behind it
    assert not [t for t in runner.study.get_trials() if not t.state.is_finished()]
    resumed, _ = make_pipelined(tiny, storage, trials=20, batch_size=4)
    assert resumed.run().evaluations == 20
    keys = measured_keys(resumed.study)
    assert len(keys) == len(set(keys)) == 20
    assert {runner.space.key(t.params) for t in cut} <= set(keys)


def test_batches_ahead_are_at_least_three_and_keep_two_compiles_per_process_queued() -> None:
    class Compiles(PreparingSpy):
        def __init__(self, workers: int) -> None:
            self.compile_workers = workers

    assert batches_ahead(Compiles(16), 16) == 3
    assert batches_ahead(Compiles(16), 32) == 3
    assert batches_ahead(Compiles(2), 8) == 3
    assert batches_ahead(Compiles(64), 16) == 8
    assert batches_ahead(object(), 16) == 1  # type: ignore[arg-type]  # prepares nothing


class DescribingSpy(SpyBackend):
    """A backend on a GPU: it describes the device that measured its Results."""

    PROPS: ClassVar[dict[str, Any]] = {
        "name": "NVIDIA H200", "multiProcessorCount": 132, "maxBlocksPerMultiProcessor": 32,
        "major": 9, "minor": 0, "maxThreadsPerBlock": 1024, "regsPerBlock": 65536,
        "sharedMemPerBlockOptin": 232448, "pciBusId": "0000:19:00.0",
    }  # fmt: skip

    def device(self) -> dict[str, Any]:
        return dict(self.PROPS)


def test_every_measured_trial_keeps_the_device_limits(tiny: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    plain, _ = make_runner(tiny, storage, trials=12, constraints=["bx >= 32"], batch_size=8)
    backend = DescribingSpy(plain.backend.inner)  # type: ignore[attr-defined]
    runner = Runner(study=plain.study, space=plain.space, backend=backend, trials=12, batch_size=8)
    for params in [{"bx": 8, "by": 4, "u": 1}, {"bx": 64, "by": 4, "u": 1}]:
        runner.study.enqueue_trial(params)  # breaks a constraint; measured
    runner.study.enqueue_trial({"bx": 64, "by": 4, "u": 1}, skip_if_exists=False)  # a repeat
    runner.run()
    trials = runner.study.get_trials()
    measured = [
        t for t in trials
        if t.user_attrs["status"] != "constraint" and "duplicate_of" not in t.user_attrs
    ]  # fmt: skip
    assert len(measured) == 12
    expected = {
        "name": "NVIDIA H200", "sm_count": 132, "max_blocks_per_sm": 32, "major": 9, "minor": 0,
        "max_threads_per_block": 1024, "regs_per_block": 65536, "shared_per_block_optin": 232448,
    }  # fmt: skip
    assert all(t.user_attrs["device_limits"] == expected for t in measured)
    others = [t for t in trials if t not in measured]
    assert others and not any("device_limits" in t.user_attrs for t in others)
