"""Counter predictors (configuration → counters) and the sampler's ``counter_features``."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from surrotune.counters.policy import PREDICTION_ATTR
from surrotune.space import SearchSpace
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.counter_model import (
    COUNTER_TARGETS,
    MIN_PROFILED,
    CounterModel,
    counter_row,
    trial_counters,
)
from surrotune.verdicts import COUNTERS_PREFIX, set_trial_verdict

optuna.logging.set_verbosity(optuna.logging.WARNING)


def planted(x: np.ndarray) -> np.ndarray:
    """A counter that depends on two features and not on the third."""
    return 100.0 * np.clip(x[:, 0] * (1.0 - x[:, 1]), 0.0, 1.0)


def test_the_predictors_learn_a_planted_counter_relation() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((300, 3))
    targets = ("achieved_occupancy", "registers")
    Y = np.column_stack([planted(X), np.full(len(X), np.nan)])
    Y[:8, 1] = 32.0 + np.arange(8)  # too few rows: left out
    model = CounterModel(targets=targets, seed=0).fit(X[:200], Y[:200])
    assert model.targets_ == ["achieved_occupancy"]
    predicted = model.predict(X[200:])[:, 0]
    truth = planted(X[200:])
    r2 = 1.0 - ((predicted - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()
    assert r2 > 0.9
    augmented = model.augment(X[200:])
    assert augmented.shape == (100, 4) and augmented.dtype == np.float32
    assert np.allclose(augmented[:, 3], predicted, rtol=1e-5)


def test_the_predictors_are_deterministic_and_refuse_unknown_targets() -> None:
    rng = np.random.default_rng(1)
    X = rng.random((50, 2))
    Y = planted(np.column_stack([X, X[:, :1]]))[:, None]
    a = CounterModel(targets=("sm_throughput",), seed=3).fit(X, Y).predict(X)
    b = CounterModel(targets=("sm_throughput",), seed=3).fit(X, Y).predict(X)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="unknown counter targets"):
        CounterModel(targets=("no_such_counter",))


def test_counter_row_reads_ratios_logs_and_gaps() -> None:
    targets = ("bank_conflicts_per_request", "log_local_bytes", "l2_hit_rate", "registers")
    row = counter_row(
        {"shared_bank_conflicts": 50.0, "shared_requests": 200.0, "local_bytes": 0,
         "l2_hit_rate": float("nan"), "registers": True},
        targets,
    )  # fmt: skip
    assert row[0] == pytest.approx(0.25)
    assert row[1] == 0.0
    assert math.isnan(row[2]) and math.isnan(row[3])  # not finite; not a number
    assert np.isnan(counter_row(None, targets)).all()
    assert set(targets) <= set(COUNTER_TARGETS)


def test_trial_counters_reads_trial_and_study_attributes() -> None:
    study = optuna.create_study()
    for k in range(3):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        if k == 0:
            trial.set_user_attr("counters", {"sm_throughput": 50.0})
        study.tell(trial, float(k))
    set_trial_verdict(
        study, COUNTERS_PREFIX, 2, {"counters": {"sm_throughput": 70.0}, "diagnosis": {}}
    )
    found = trial_counters(study.get_trials(deepcopy=False), study.user_attrs)
    assert found == {0: {"sm_throughput": 50.0}, 2: {"sm_throughput": 70.0}}


def counter_objective(with_counters: bool):
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        y = trial.suggest_int("y", 1, 32, log=True)
        occupancy = 400.0 * x * (1.0 - x)
        if with_counters:
            trial.set_user_attr(
                "counters", {"achieved_occupancy": occupancy, "registers": 16.0 * y}
            )
        return 1.0 + (100.0 - occupancy) / 10.0 + abs(math.log2(y) - 2)

    return objective


def plain(with_counters: bool, counter_features: bool, trials: int = 24):
    sampler = SurrogateSampler(
        seed=0, n_startup_trials=5, pool_size=256, counter_features=counter_features
    )
    study = optuna.create_study(sampler=sampler)
    study.optimize(counter_objective(with_counters), n_trials=trials)
    return study, sampler


def test_plain_study_without_counters_behaves_as_before() -> None:
    off, _ = plain(with_counters=False, counter_features=False)
    on, sampler = plain(with_counters=False, counter_features=True)
    assert [t.params for t in on.trials] == [t.params for t in off.trials]
    assert sampler._fit is not None and sampler._fit.counters is None


def test_plain_study_learns_the_counters_it_is_given() -> None:
    study, sampler = plain(with_counters=True, counter_features=True)
    assert len(study.trials) == 24
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    fit = sampler._fit
    assert fit is not None and fit.counters is not None
    assert fit.counters.targets_ == ["achieved_occupancy", "registers"]
    assert study.best_value < 4.0


def test_few_counters_change_nothing() -> None:
    """Below MIN_PROFILED trials with counters the sampler behaves exactly as without them."""
    base = counter_objective(with_counters=True)

    def objective(trial: optuna.Trial) -> float:
        value = base(trial)
        if trial.number >= MIN_PROFILED - 1:
            trial.set_user_attr("counters", {})
        return value

    def run(counter_features: bool):
        sampler = SurrogateSampler(
            seed=2, n_startup_trials=4, pool_size=128, counter_features=counter_features
        )
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=16)
        return [t.params for t in study.trials]

    assert run(True) == run(False)


def test_space_study_reads_counters_from_study_attributes() -> None:
    space = SearchSpace(
        {"a": [1, 2, 4, 8, 16], "b": [1, 2, 4, 8, 16], "c": [0, 1]}, ["a * b <= 64"]
    )
    sampler = SurrogateSampler(space=space, seed=0, n_startup_trials=6, counter_features=True)
    study = optuna.create_study(sampler=sampler)
    for _ in range(20):
        trial = study.ask()
        a, b, c = (trial.suggest_categorical(n, space.values[n]) for n in ("a", "b", "c"))
        value = 1.0 + abs(math.log2(a * b) - 3) + 0.5 * c
        study.tell(trial, value)
        set_trial_verdict(
            study, COUNTERS_PREFIX, trial.number,
            {"counters": {"achieved_occupancy": 10.0 * math.log2(a * b)}, "reason": "all"},
        )  # fmt: skip
    assert sampler._fit is not None and sampler._fit.counters is not None
    assert sampler._fit.counters.targets_ == ["achieved_occupancy"]
    configs = [tuple(t.params.values()) for t in study.trials]
    assert len(set(configs)) == len(configs)


def test_the_prediction_is_left_on_each_model_proposal() -> None:
    study, _ = plain(with_counters=False, counter_features=False, trials=16)
    predicted = [t.system_attrs.get(PREDICTION_ATTR) for t in study.trials]
    assert predicted[:5] == [None] * 5  # the space-filling start: no model yet
    later = [p for p in predicted[5:] if p is not None]
    assert len(later) == 11
    values = [t.value for t in study.trials]
    # in the objective's own units (not log): inside the range of what was measured, roughly
    assert all(0.5 * min(values) <= p <= 2.0 * max(values) for p in later)


def test_the_prediction_is_in_the_objective_units_when_maximising() -> None:
    sampler = SurrogateSampler(seed=0, n_startup_trials=4, pool_size=128)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: 1000.0 + 10.0 * t.suggest_float("x", 0.0, 10.0), n_trials=10)
    later = [t.system_attrs[PREDICTION_ATTR] for t in study.trials[4:]]
    assert len(later) == 6 and all(900.0 <= p <= 1200.0 for p in later)


def test_bench_registers_the_counter_variants() -> None:
    from surrotune.bench.harness import _make, parse_samplers

    space = SearchSpace({"a": [1, 2, 4], "b": [1, 2]}, [])
    specs = {
        s.label: s for s in parse_samplers("surrogate,surrogate-counters,surrogate-counters-all")
    }
    assert {s.name for s in specs.values()} == {"surrogate"}
    plain_sampler = _make(specs["surrogate"], space, seed=0)
    counters = _make(specs["surrogate-counters"], space, seed=0)
    every = _make(specs["surrogate-counters-all"], space, seed=0)
    assert not plain_sampler.counter_features  # type: ignore[attr-defined]
    assert counters.counter_features and counters.counter_targets is None  # type: ignore[attr-defined]
    assert every.counter_targets == tuple(COUNTER_TARGETS)  # type: ignore[attr-defined]
