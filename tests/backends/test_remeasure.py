"""Measuring the top configurations again, interleaved: the verdict, the interleaving, the
replay stand-in, what is stored, and the real thing on the GPU (``gpu``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import optuna
import pytest

from surrotune.backends.cuda import CudaBackend
from surrotune.backends.remeasure import (
    NOISE_FLOOR,
    InterleavedRemeasurer,
    Remeasurement,
    Remeasures,
    ReplayRemeasurer,
    Verdict,
    judge,
    relative_spread,
    remeasure_top,
    remeasurer_for,
)
from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.cli import main
from surrotune.experiment import load_experiment
from surrotune.result import ParamValue, Result, Status
from surrotune.verdicts import REMEASURE_ATTR, REMEASURED_PREFIX, set_trial_verdict, trial_verdicts

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests" / "fixtures" / "broken" / "broken.toml"
sys.path.insert(0, str(REPO / "tests"))
from test_runner import write_kt_cache  # noqa: E402

# --------------------------------------------------------------------------- the verdict


def test_relative_spread() -> None:
    assert relative_spread([]) == 0.0 and relative_spread([1.0]) == 0.0
    assert relative_spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    # quartiles of 1..5 (inclusive method) are 2 and 4, the median 3
    assert relative_spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2 / 3)


def test_the_winner_still_fastest_held() -> None:
    verdict, fastest, difference, _ = judge([[1.0, 1.01, 0.99], [1.2, 1.21], [1.5]])
    assert (verdict, fastest, difference) == (Verdict.HELD, 0, 0.0)


def test_a_lead_inside_the_noise_floor_holds_within_noise() -> None:
    verdict, fastest, difference, tolerance = judge([[1.005] * 5, [1.0] * 5, [2.0] * 5])
    assert verdict is Verdict.WITHIN_NOISE and fastest == 1
    assert difference == pytest.approx(0.005) and tolerance == NOISE_FLOOR


def test_a_noisy_winner_holds_within_its_spread() -> None:
    winner = [1.0, 1.1, 1.2, 1.3, 1.4]  # median 1.2, spread (1.3 - 1.1) / 1.2 = 16.7 %
    verdict, fastest, difference, tolerance = judge([winner, [1.1] * 5])
    assert verdict is Verdict.WITHIN_NOISE and fastest == 1
    assert difference == pytest.approx(0.1 / 1.1)
    assert tolerance == pytest.approx(0.2 / 1.2)


def test_a_clear_lead_means_the_winner_did_not_hold() -> None:
    verdict, fastest, difference, tolerance = judge([[1.1] * 4, [1.2] * 4, [1.0, 1.0, 1.01, 1.0]])
    assert verdict is Verdict.LOST and fastest == 2
    assert difference == pytest.approx(0.1) and tolerance < difference


def test_entries_without_samples_take_no_part() -> None:
    assert judge([[2.0], [], [3.0]])[:2] == (Verdict.HELD, 0)
    with pytest.raises(ValueError, match="winner has no samples"):
        judge([[], [1.0]])


# --------------------------------------------------------------------------- remeasurers


class Stopwatch:
    """A live backend imitation: configuration x runs in x ms; it logs every evaluation, and
    the configurations in ``fail_on`` fail the n-th time they are measured."""

    def __init__(self, fail_on: Mapping[int, int] | None = None) -> None:
        self.order: list[int] = []
        self.fail_on = dict(fail_on or {})

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
        results = []
        for config in configs:
            x = int(config["x"])
            self.order.append(x)
            if self.order.count(x) == self.fail_on.get(x):
                results.append(Result(dict(config), Status.CORRECTNESS, error="bad output\nmore"))
                continue
            times = (float(x), float(x) * 1.02, float(x) * 0.98)
            results.append(Result(dict(config), Status.OK, objective=float(x), times_ms=times))
        return results

    def close(self) -> None:
        pass


def test_rounds_are_interleaved_and_one_sample_per_round() -> None:
    backend = Stopwatch()
    measured = InterleavedRemeasurer(backend).remeasure([{"x": 3}, {"x": 1}, {"x": 2}], 4)
    assert backend.order == [3, 1, 2] * 4  # A B C A B C ..., never A A A A B B B B
    assert [m.times_ms for m in measured] == [(3.0,) * 4, (1.0,) * 4, (2.0,) * 4]  # the medians
    assert all(m.status is Status.OK for m in measured)


def test_a_configuration_that_fails_again_is_not_measured_further() -> None:
    backend = Stopwatch(fail_on={1: 2})
    measured = InterleavedRemeasurer(backend).remeasure([{"x": 3}, {"x": 1}], 3)
    assert backend.order == [3, 1, 3, 1, 3]
    assert measured[1] == Remeasurement({"x": 1}, (1.0,), Status.CORRECTNESS, "bad output\nmore")
    assert measured[0].times_ms == (3.0, 3.0, 3.0)


def test_replay_returns_the_recorded_repeats(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    remeasurer = ReplayRemeasurer(dataset)
    best, other, broken, absent = remeasurer.remeasure(
        [{"bx": 64, "by": 4, "u": 1}, {"bx": 32, "by": 4, "u": 1}, {"bx": 8, "by": 1, "u": 1},
         {"bx": 7, "by": 1, "u": 1}],
        rounds=10,
    )  # fmt: skip
    assert best.times_ms == pytest.approx((1.0, 1.01, 0.99)) and best.status is Status.OK
    assert other.median_ms == pytest.approx(3.0)
    assert broken.status is Status.COMPILE and broken.times_ms == ()
    assert absent.status is Status.CONSTRAINT


def test_remeasurer_for_each_backend(tmp_path: Path) -> None:
    replay = ReplayBackend(load_dataset(write_kt_cache(tmp_path / "tiny.json")))
    assert isinstance(remeasurer_for(replay), ReplayRemeasurer)
    cuda = CudaBackend(load_experiment(BROKEN))  # no worker starts until it measures
    found = remeasurer_for(cuda)
    assert isinstance(found, InterleavedRemeasurer) and found.backend is cuda
    assert remeasurer_for(Stopwatch()) is None  # a backend that was not taught how

    class Native(Stopwatch):
        source = "native"

        def remeasure(
            self, configs: Sequence[Mapping[str, ParamValue]], rounds: int
        ) -> list[Remeasurement]:
            return []

    native = Native()
    assert isinstance(native, Remeasures) and remeasurer_for(native) is native


# --------------------------------------------------------------------------- on a study


def ok_study(values: Mapping[int, float]) -> optuna.Study:
    study = optuna.create_study(study_name="r", direction="minimize")
    distributions = {"x": optuna.distributions.CategoricalDistribution(list(range(20)))}
    for x, value in values.items():
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x},
                distributions=distributions,
                value=value,
                user_attrs={"status": "ok", "config_key": str(x), "objective": value},
            )
        )
    return study


def test_top_k_measured_again_stored_and_judged() -> None:
    # x = the time it takes now; the search saw trial 2 (x=5) as best by luck
    study = ok_study({9: 9.5, 3: 3.2, 5: 2.9, 4: 4.1, 12: 12.0, 11: 11.0})
    backend = Stopwatch()
    report = remeasure_top(study, InterleavedRemeasurer(backend), top=3, rounds=5)
    assert report is not None
    assert report.trials == (2, 1, 3)  # best first: 2.9, 3.2, 4.1
    assert backend.order == [5, 3, 4] * 5
    assert report.verdict is Verdict.LOST and report.fastest == 1
    assert report.difference == pytest.approx(2 / 3)
    stored = trial_verdicts(study, REMEASURED_PREFIX)
    assert stored == {2: [5.0] * 5, 1: [3.0] * 5, 3: [4.0] * 5}
    summary = study.user_attrs[REMEASURE_ATTR]
    assert summary["verdict"] == "did not hold" and summary["fastest"] == 1
    assert summary["trials"] == [2, 1, 3] and summary["rounds"] == 5
    lines = report.lines()
    assert lines[0] == (
        "Re-measured the top 3 configurations (interleaved, 5 rounds; median ms, spread):"
    )
    assert lines[1] == "  trial 2: 5 ms, spread 0.0 % (search: 2.9)  <- winner"
    assert lines[-1] == (
        "The winner did not hold: trial 1 is 66.7 % faster, beyond the 1.0 % tolerance."
    )


def test_the_winner_failing_again_is_reported() -> None:
    study = ok_study({1: 1.0, 2: 2.0})
    report = remeasure_top(study, InterleavedRemeasurer(Stopwatch(fail_on={1: 1})), rounds=3)
    assert report is not None and report.verdict is None
    assert report.failure == "correctness: bad output"
    assert report.lines()[1] == "  trial 0: correctness when measured again: bad output  <- winner"
    assert report.lines()[-1] == "The winner could not be checked: correctness: bad output"
    assert REMEASURED_PREFIX + "0" not in study.user_attrs  # nothing was measured for it


def test_nothing_to_compare_and_demoted_trials_left_out() -> None:
    assert remeasure_top(ok_study({1: 1.0}), InterleavedRemeasurer(Stopwatch())) is None
    study = ok_study({1: 1.0, 2: 2.0, 3: 3.0})
    set_trial_verdict(study, "sanitizer.", 0, {"outcome": "finding", "status": "correctness"})
    backend = Stopwatch()
    report = remeasure_top(study, InterleavedRemeasurer(backend), rounds=2)
    assert report is not None and report.trials == (1, 2) and 1 not in backend.order
    with pytest.raises(ValueError, match="top >= 2"):
        remeasure_top(study, InterleavedRemeasurer(backend), top=1)


def test_the_command_line_prints_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "r.db"
    code = main(
        ["run", "--dataset", str(cache), "--sampler", "brute-force", "--trials", "32",
         "--storage", str(db), "--no-progress", "--remeasure", "3"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "Re-measured the top 3 configurations (replayed from the recording's repeats" in out
    assert "The winner held: it is still the fastest." in out
    code = main(["run", "--dataset", str(cache), "--storage", str(db), "--remeasure", "1"])
    assert code == 2
    assert "--remeasure must be 0 (off) or at least 2" in capsys.readouterr().err
    code = main(
        ["run", "--dataset", str(cache), "--storage", str(tmp_path / "off.db"), "--trials", "8",
         "--no-progress", "--remeasure", "0"]
    )  # fmt: skip
    assert code == 0 and "Re-measured" not in capsys.readouterr().out


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_interleaved_remeasurement(tmp_path: Path) -> None:
    configs: list[dict[str, ParamValue]] = [
        {"BLOCK": 256, "MODE": "ok"},
        {"BLOCK": 64, "MODE": "ok"},
        {"BLOCK": 1024, "MODE": "ok"},
    ]
    with CudaBackend(load_experiment(BROKEN), cache_dir=tmp_path / "cache") as backend:
        measured = InterleavedRemeasurer(backend).remeasure(configs, 4)
    for m in measured:
        assert m.status is Status.OK, m.error
        assert len(m.times_ms) == 4 and all(t > 0 for t in m.times_ms)
    verdict, fastest, difference, tolerance = judge([list(m.times_ms) for m in measured])
    if verdict is Verdict.HELD:  # the first one is still the fastest: nothing to weigh
        assert (fastest, difference, tolerance) == (0, 0.0, 0.0)
    else:
        assert fastest != 0 and difference > 0 and tolerance >= NOISE_FLOOR
