"""Samplers by name, and the feasible brute force: order, feasibility, exhaustion, sharing."""

from __future__ import annotations

import datetime
import importlib.util
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from surrotune.sampling import (
    SAMPLER_NAMES,
    FeasibleBruteForceSampler,
    distributions,
    make_sampler,
)
from surrotune.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

PARAMETERS = {"bx": [8, 16, 32, 64], "by": [1, 2, 4, 8], "mode": ["a", "b"], "vec": [1, 2]}
CONSTRAINTS = ["bx * by <= 128", "vec == 1 or bx >= 16"]


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(PARAMETERS, CONSTRAINTS)


def feasible_set(space: SearchSpace) -> set[str]:
    return {space.key(row) for row in space.enumerate().to_dict("records")}


def brute_study(space: SearchSpace, seed: int | None, **kwargs: Any) -> optuna.Study:
    return optuna.create_study(sampler=FeasibleBruteForceSampler(space, seed=seed), **kwargs)


def proposals(study: optuna.Study, space: SearchSpace, n: int) -> list[dict[str, Any]]:
    """Ask and tell ``n`` trials; the params of each, in order."""
    out = []
    for i in range(n):
        trial = study.ask(distributions(space))
        out.append(dict(trial.params))
        study.tell(trial, float(i % 7))
    return out


def drain(study: optuna.Study, space: SearchSpace) -> list[dict[str, Any]]:
    """Ask (and tell) until the brute force raises; every proposal, in order."""
    out = []
    while True:
        try:
            trial = study.ask(distributions(space))
        except optuna.exceptions.OptunaError:
            return out
        out.append(dict(trial.params))
        study.tell(trial, 1.0)
        assert len(out) <= len(space.enumerate()), "brute force proposed more than the space"


def running_trial(number: int) -> FrozenTrial:
    return FrozenTrial(
        number=number, state=TrialState.RUNNING, value=None,
        datetime_start=datetime.datetime.now(), datetime_complete=None, params={},
        distributions={}, user_attrs={}, system_attrs={}, intermediate_values={},
        trial_id=number,
    )  # fmt: skip


# ------------------------------------------------------------------- FeasibleBruteForceSampler


def test_distributions_are_categorical_over_the_ordered_values(space: SearchSpace) -> None:
    dists = distributions(space)
    assert list(dists) == list(PARAMETERS)
    for name, values in PARAMETERS.items():
        assert isinstance(dists[name], CategoricalDistribution)
        assert list(dists[name].choices) == values


def test_brute_force_walks_every_feasible_configuration_once(space: SearchSpace) -> None:
    walked = drain(brute_study(space, seed=3), space)
    keys = [space.key(config) for config in walked]
    assert len(keys) == len(set(keys)) == len(space.enumerate())
    assert set(keys) == feasible_set(space)
    assert all(space.is_feasible(config) for config in walked)
    # the space really is cut by the constraints, so feasibility is not trivially true
    assert len(space.enumerate()) < space.product_size


def test_brute_force_values_are_plain_python(space: SearchSpace) -> None:
    for config in drain(brute_study(space, seed=0), space):
        assert {type(v) for k, v in config.items() if k != "mode"} == {int}
        assert type(config["mode"]) is str


def test_brute_force_is_deterministic_for_a_seed(space: SearchSpace) -> None:
    first = drain(brute_study(space, seed=11), space)
    again = drain(brute_study(space, seed=11), space)
    other = drain(brute_study(space, seed=12), space)
    assert first == again
    assert first != other  # a seeded random order, not the enumeration order
    assert sorted(map(space.key, first)) == sorted(map(space.key, other))


def test_brute_force_raises_optuna_error_when_exhausted(space: SearchSpace) -> None:
    study = brute_study(space, seed=0)
    drain(study, space)
    with pytest.raises(optuna.exceptions.OptunaError, match="every feasible configuration"):
        study.ask(distributions(space))
    with pytest.raises(optuna.exceptions.OptunaError):  # and stays exhausted
        study.ask(distributions(space))


def test_exhausted_brute_force_leaves_no_running_trial(space: SearchSpace) -> None:
    study = brute_study(space, seed=0)
    drain(study, space)
    with pytest.raises(optuna.exceptions.OptunaError):
        study.ask(distributions(space))
    assert [t.number for t in study.get_trials(states=(TrialState.RUNNING,))] == []


def test_brute_force_skips_configurations_finished_trials_hold(space: SearchSpace) -> None:
    study = brute_study(space, seed=5)
    order = drain(brute_study(space, seed=5), space)
    # another runner already measured the first three and failed the fifth of this order
    for config in order[:3]:
        study.add_trial(
            optuna.trial.create_trial(params=config, distributions=distributions(space), value=1.0)
        )
    study.add_trial(
        optuna.trial.create_trial(
            params=order[4], distributions=distributions(space), state=TrialState.FAIL
        )
    )
    walked = drain(study, space)
    held = {space.key(c) for c in order[:3]} | {space.key(order[4])}
    assert [space.key(c) for c in walked] == [
        space.key(c) for c in order if space.key(c) not in held
    ]


def test_brute_force_skips_configurations_running_trials_hold(space: SearchSpace) -> None:
    storage = optuna.storages.InMemoryStorage()
    first = optuna.create_study(
        storage=storage, study_name="shared", sampler=FeasibleBruteForceSampler(space, seed=2)
    )
    # runner 1 asks a batch of three and has not told them yet (RUNNING)
    pending = [first.ask(distributions(space)) for _ in range(3)]
    assert all(t.number == i for i, t in enumerate(pending))
    # runner 2: same seed, so the same order; it must start after the three pending ones
    second = optuna.load_study(
        study_name="shared", storage=storage, sampler=FeasibleBruteForceSampler(space, seed=2)
    )
    trial = second.ask(distributions(space))
    order = drain(brute_study(space, seed=2), space)
    assert [dict(t.params) for t in pending] == order[:3]
    assert dict(trial.params) == order[3]
    # and the pending batch is told afterwards; nothing is proposed twice overall
    for t in pending:
        first.tell(t, 1.0)
    second.tell(trial, 1.0)
    rest = drain(second, space)
    keys = [space.key(t.params) for t in second.trials if t.params]
    assert len(keys) == len(set(keys)) == len(space.enumerate())
    assert len(rest) == len(space.enumerate()) - 4


def test_brute_force_skips_configurations_waiting_trials_hold(space: SearchSpace) -> None:
    study = brute_study(space, seed=4)
    first = drain(brute_study(space, seed=4), space)[0]
    study.enqueue_trial(first)  # e.g. a resumed runner re-queues an interrupted trial
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1
    # another runner samples while the trial still waits (it has not popped it)
    sampler = FeasibleBruteForceSampler(space, seed=4)
    proposed = sampler.sample_relative(study, running_trial(99), distributions(space))
    assert space.key(proposed) != space.key(first)


def test_enqueued_trial_does_not_consume_a_brute_force_proposal(space: SearchSpace) -> None:
    study = brute_study(space, seed=6)
    order = drain(brute_study(space, seed=6), space)
    study.enqueue_trial(order[-1])
    walked = drain(study, space)
    assert walked[0] == order[-1]
    assert sorted(map(space.key, walked)) == sorted(feasible_set(space))


def test_brute_force_works_through_plain_optimize(space: SearchSpace) -> None:
    """A plain Optuna sampler: ``study.optimize`` with suggest calls sees only feasible ones."""
    study = brute_study(space, seed=9)

    def objective(trial: optuna.Trial) -> float:
        config = {
            name: trial.suggest_categorical(name, values) for name, values in PARAMETERS.items()
        }
        assert space.is_feasible(config)
        return float(config["bx"] * config["by"])

    n = len(space.enumerate())
    study.optimize(objective, n_trials=n)
    assert {space.key(t.params) for t in study.trials} == feasible_set(space)


# ------------------------------------------------------------------- make_sampler


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("random", optuna.samplers.RandomSampler),
        ("tpe", optuna.samplers.TPESampler),
        ("tpe-multivariate", optuna.samplers.TPESampler),
        ("tpe-independent", optuna.samplers.TPESampler),
        ("brute-force", FeasibleBruteForceSampler),
    ],
)
def test_make_sampler_returns_the_named_class(space: SearchSpace, name: str, cls: type) -> None:
    sampler = make_sampler(name, space, seed=0)
    assert type(sampler) is cls
    assert isinstance(sampler, optuna.samplers.BaseSampler)


@pytest.mark.parametrize("name", ["random", "tpe", "brute-force"])
def test_make_sampler_honours_the_seed(space: SearchSpace, name: str) -> None:
    n = 15  # past TPE's 10 random start-up trials, so its model proposals are compared too

    def run(seed: int) -> list[dict[str, Any]]:
        study = optuna.create_study(sampler=make_sampler(name, space, seed=seed))
        return proposals(study, space, n)

    first, again, other = run(21), run(21), run(22)
    assert first == again
    assert first != other


def test_make_sampler_knows_every_advertised_name(space: SearchSpace) -> None:
    torch = importlib.util.find_spec("torch") is not None
    for name in SAMPLER_NAMES:
        if name == "gp" and not torch:
            continue
        assert isinstance(make_sampler(name, space, seed=1), optuna.samplers.BaseSampler)


def test_tpe_independent_models_each_parameter_alone(space: SearchSpace) -> None:
    """The issue's "TPE" peer as the 2011 paper has it: one density per parameter, whereas
    Optuna 5's default TPESampler (``tpe``) is multivariate."""
    def joint_space(name: str) -> dict[str, Any]:
        study = optuna.create_study(sampler=make_sampler(name, space, seed=0))
        proposals(study, space, 3)
        study.ask()
        return study.sampler.infer_relative_search_space(study, study.trials[-1])

    assert joint_space("tpe-independent") == {}  # every parameter sampled on its own
    assert set(joint_space("tpe")) == set(space.names)


def test_gp_without_torch_says_how_to_install_it(space: SearchSpace) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here, so the 'gp' sampler is available")
    with pytest.raises(ValueError, match="pip install torch"):
        make_sampler("gp", space, seed=0)


def test_unknown_sampler_name_is_a_value_error_listing_the_names(space: SearchSpace) -> None:
    with pytest.raises(ValueError, match="unknown sampler 'annealing'") as info:
        make_sampler("annealing", space, seed=0)
    for name in SAMPLER_NAMES:
        assert name in str(info.value)
