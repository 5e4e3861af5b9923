"""SurrogateSampler in a plain Optuna study and in surrotune's runner on a replayed cache."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.result import Status
from surrotune.runner import Runner
from surrotune.sampling import distributions
from surrotune.space import SearchSpace
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.sampler import GENERIC_FAILURE, _learned
from surrotune.verdicts import SANITIZER_PREFIX, set_trial_verdict
from tests.test_runner import write_kt_cache, write_kt_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    n = trial.suggest_int("n", 1, 64, log=True)
    kind = trial.suggest_categorical("kind", ["a", "b", "c"])
    step = trial.suggest_float("step", 0.0, 1.0, step=0.25)
    if kind == "c" and n > 32:
        raise RuntimeError("planted failure")  # a FAIL trial without a status attribute
    return (x - 1) ** 2 + (lr - 0.01) ** 2 + abs(n - 8) + (kind == "b") + step


def plain_params(seed: int, trials: int = 10) -> list[dict[str, Any]]:
    study = optuna.create_study(
        sampler=SurrogateSampler(seed=seed, n_startup_trials=4, pool_size=512)
    )
    study.optimize(objective, n_trials=trials, catch=(RuntimeError,))
    return [t.params for t in study.trials]


def test_plain_study_suggestions_lie_inside_the_distributions() -> None:
    study = optuna.create_study(
        sampler=SurrogateSampler(seed=1, n_startup_trials=5, pool_size=512)
    )
    study.optimize(objective, n_trials=20, catch=(RuntimeError,))
    for trial in study.trials:
        for name, value in trial.params.items():
            dist = trial.distributions[name]
            assert dist._contains(dist.to_internal_repr(value)), (name, value)
    assert study.best_value < 12  # it optimises, a little


def test_plain_study_is_deterministic_for_a_seed() -> None:
    first = plain_params(0)
    assert first == plain_params(0)
    assert first != plain_params(1)


def test_plain_study_maximises() -> None:
    study = optuna.create_study(
        direction="maximize", sampler=SurrogateSampler(seed=0, n_startup_trials=5)
    )
    study.optimize(lambda t: -((t.suggest_float("x", 0.0, 10.0) - 7) ** 2), n_trials=15)
    assert abs(study.best_params["x"] - 7) < 1.0


def space_study(tmp_path: Path, constraints: list[str]) -> tuple[Runner, SearchSpace]:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, constraints)
    study = optuna.create_study(
        direction="minimize", sampler=SurrogateSampler(space=space, seed=0, n_startup_trials=4)
    )
    backend = ReplayBackend(dataset)
    return Runner(study=study, space=space, backend=backend, trials=100, batch_size=3), space


def test_runner_never_repeats_and_respects_constraints(tmp_path: Path) -> None:
    runner, space = space_study(tmp_path, ["bx * by <= 256"])
    summary = runner.run()
    trials = [t for t in runner.study.get_trials() if t.params]  # the last ask found none
    keys = [space.key(t.params) for t in trials]
    assert len(keys) == len(set(keys))  # no configuration twice
    assert all(t.user_attrs["status"] != "constraint" for t in trials)
    assert all(t.params["bx"] * t.params["by"] <= 256 for t in trials)
    assert summary.stop_reason == "exhausted" and len(keys) == len(space)
    assert summary.best is not None and summary.best.value == pytest.approx(1.0)


def test_pending_trials_are_not_proposed_again(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters)
    sampler = SurrogateSampler(space=space, seed=3, n_startup_trials=2)
    study = optuna.create_study(sampler=sampler)
    dists = distributions(space)
    for _ in range(6):  # finished trials, so the models are in use
        trial = study.ask(dists)
        result = dataset.lookup(trial.params)
        assert result is not None
        if result.ok:
            study.tell(trial, result.objective)
        else:
            trial.set_user_attr("status", result.status.value)
            study.tell(trial, state=TrialState.FAIL)
    for _ in range(20):
        study.ask(dists)  # never told: all pending
    held = {space.key(t.params) for t in study.get_trials()}
    free = [c for c in space.enumerate().to_dict("records") if space.key(c) not in held]
    enqueued = {k: int(v) for k, v in free[0].items()}
    study.enqueue_trial(enqueued)  # waiting: taken, though not asked yet
    more = [
        sampler.sample_relative(
            study,
            study._storage.get_trial(study._storage.create_new_trial(study._study_id)),
            dists,
        )
        for _ in range(5)
    ]
    keys = [space.key(t.params) for t in study.get_trials() if t.params]
    assert len(keys) == len(set(keys)) == 26
    proposed = [space.key(c) for c in more]
    assert not set(proposed) & (set(keys) | {space.key(enqueued)})


def test_which_trials_are_learned() -> None:
    def frozen(state: TrialState, value: float | None = None, **attrs: Any) -> Any:
        return optuna.trial.create_trial(
            params={"x": 1.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 2)},
            state=state, value=value, user_attrs=attrs,
        )  # fmt: skip

    assert _learned(frozen(TrialState.COMPLETE, 2.0, status="ok")) == (2.0, "ok")
    assert _learned(frozen(TrialState.FAIL)) == (None, GENERIC_FAILURE)
    assert _learned(frozen(TrialState.FAIL, status="resource")) == (None, "resource")
    assert _learned(frozen(TrialState.FAIL, status="constraint")) is None
    assert _learned(frozen(TrialState.FAIL, status="resource", interrupted=True)) is None
    assert _learned(frozen(TrialState.FAIL, status="resource", duplicate_of=0)) is None
    assert _learned(frozen(TrialState.COMPLETE, 2.0, status="ok", duplicate_of=0)) is None
    # a sanitizer finding after the fact (a study attribute) makes a COMPLETE trial a failure
    complete = frozen(TrialState.COMPLETE, 2.0, status="ok")
    demoted = {complete.number: Status.CORRECTNESS}
    assert _learned(complete, demoted) == (None, "correctness")
    assert _learned(complete, {complete.number + 1: Status.RUNTIME}) == (2.0, "ok")


def test_the_models_learn_a_demoted_trial_as_a_failure(tmp_path: Path) -> None:
    runner, _ = space_study(tmp_path, [])
    runner.trials = 12
    runner.run()
    study = runner.study
    best = min((t for t in study.get_trials() if t.value is not None), key=lambda t: t.value)
    set_trial_verdict(
        study, SANITIZER_PREFIX, best.number, {"outcome": "finding", "status": "runtime"}
    )
    sampler = study.sampler
    assert isinstance(sampler, SurrogateSampler)
    probe = study.ask()
    obs = sampler._observe_space(study, study._storage.get_trial(probe._trial_id), sampler._table)
    learned = dict(zip(obs.numbers, zip(obs.values, obs.statuses, strict=True), strict=True))
    assert learned[best.number] == (None, "runtime")
    ok = [t for t in study.get_trials() if t.value is not None and t.params]
    assert sum(v is not None for v, _ in learned.values()) == len(ok) - 1


def _replayed_trials(
    dataset: Any, space: SearchSpace, sampler: SurrogateSampler, n: int
) -> list[optuna.trial.FrozenTrial]:
    """The trials with parameters of an n-trial sequential replay of ``dataset``."""
    study = optuna.create_study(direction="minimize", sampler=sampler)
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=n, batch_size=1).run()
    return [t for t in study.get_trials() if t.params]


def test_local_share_walks_the_coordinates_of_the_best(tmp_path: Path) -> None:
    """With local_share=1 every model-based proposal differs from one of the best measured
    configurations in exactly one parameter (while such candidates remain)."""
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(
        space=space, seed=1, n_startup_trials=4, local_share=1.0, local_elites=1
    )
    trials = _replayed_trials(dataset, space, sampler, 12)
    for i in range(4, len(trials)):
        done = [t for t in trials[:i] if t.value is not None]
        best = min(done, key=lambda t: t.value).params
        untried = [
            c for c in space.enumerate().to_dict("records")
            if sum(c[n] != best[n] for n in space.names) == 1
            and space.key(c) not in {space.key(t.params) for t in trials[:i]}
        ]  # fmt: skip
        if untried:
            differing = sum(trials[i].params[n] != best[n] for n in space.names)
            assert differing == 1, (i, trials[i].params, best)


def test_local_radius_two_reaches_the_two_parameter_neighbours(tmp_path: Path) -> None:
    """With local_radius=2 the model-based proposals differ from the best in one or two
    parameters, never none and never more (while such candidates remain)."""
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(
        space=space, seed=3, n_startup_trials=4, local_share=1.0, local_elites=1,
        local_radius=2, marginal_share=0.0,
    )  # fmt: skip
    trials = _replayed_trials(dataset, space, sampler, 12)
    checked = 0
    for i in range(4, len(trials)):
        done = [t for t in trials[:i] if t.value is not None]
        best = min(done, key=lambda t: t.value).params
        tried = {space.key(t.params) for t in trials[:i]}
        untried = [
            c for c in space.enumerate().to_dict("records")
            if 1 <= sum(c[n] != best[n] for n in space.names) <= 2 and space.key(c) not in tried
        ]  # fmt: skip
        if untried:
            differing = sum(trials[i].params[n] != best[n] for n in space.names)
            assert 1 <= differing <= 2, (i, trials[i].params, best)
            checked += 1
    assert checked >= 4


def _wide_cache(path: Path) -> Path:
    """A Kernel Tuner cache of 8 x 8 x 2 x 2 = 256 configurations without failures: wide
    enough that the elites' common subspace outlasts a short run."""
    params = {"a": list(range(8)), "b": list(range(8)), "c": [0, 1], "d": [0, 1]}
    cache = {}
    for a, b, c, d in itertools.product(*params.values()):
        t = 1.0 + abs(a - 5) / 4 + abs(b - 2) / 3 + 0.7 * c + 0.4 * (a * b % 3) + 0.2 * d
        cache[f"{a},{b},{c},{d}"] = {"a": a, "b": b, "c": c, "d": d, "time": t,
                                     "times": [t, t, t], "compile_time": 1.0,
                                     "verification_time": 0, "benchmark_time": 1.0}  # fmt: skip
    return write_kt_doc(path, params, cache)


def test_subspace_share_keeps_what_the_elites_agree_on(tmp_path: Path) -> None:
    """With subspace_share=1 every model-based proposal holds each value that the
    ``subspace_elites`` best measured configurations share (while such candidates remain)."""
    dataset = load_dataset(_wide_cache(tmp_path / "wide.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(
        space=space, seed=1, n_startup_trials=6, subspace_share=1.0, subspace_elites=3,
        marginal_share=0.0,
    )  # fmt: skip
    trials = _replayed_trials(dataset, space, sampler, 20)
    checked = 0
    for i in range(6, len(trials)):
        done = sorted((t for t in trials[:i] if t.value is not None), key=lambda t: t.value)
        elites = [t.params for t in done[:3]]
        agreed = {n: elites[0][n] for n in space.names if len({e[n] for e in elites}) == 1}
        tried = {space.key(t.params) for t in trials[:i]}
        inside = [
            c for c in space.enumerate().to_dict("records")
            if all(c[n] == v for n, v in agreed.items()) and space.key(c) not in tried
        ]  # fmt: skip
        if agreed and inside:
            assert all(trials[i].params[n] == v for n, v in agreed.items()), (i, agreed)
            checked += 1
    assert checked >= 8


def test_subspace_and_radius_options_are_checked() -> None:
    with pytest.raises(ValueError, match="subspace_share"):
        SurrogateSampler(subspace_share=1.5)
    with pytest.raises(ValueError, match="subspace_elites"):
        SurrogateSampler(subspace_elites=1)
    with pytest.raises(ValueError, match="local_radius"):
        SurrogateSampler(local_radius=0)


def _portfolio_study(tmp_path: Path, **options: Any) -> tuple[optuna.Study, SearchSpace, Any]:
    tmp_path.mkdir(exist_ok=True)
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(space=space, seed=2, n_startup_trials=4, portfolio=True,
                               **options)  # fmt: skip
    study = optuna.create_study(direction="minimize", sampler=sampler)
    return study, space, ReplayBackend(dataset)


def test_portfolio_proposes_new_feasible_configurations_deterministically(
    tmp_path: Path,
) -> None:
    runs = []
    for k in range(2):
        study, space, backend = _portfolio_study(tmp_path / str(k))
        Runner(study=study, space=space, backend=backend, trials=14, batch_size=1).run()
        params = [t.params for t in study.get_trials() if t.params]
        assert len(params) == 14
        assert len({space.key(p) for p in params}) == 14  # never one configuration twice
        runs.append(params)
        gains = study.sampler._gains
        assert np.isfinite(gains).all() and (gains < 0).any()  # the nominees were scored
    assert runs[0] == runs[1]  # deterministic for a seed


def test_portfolio_follows_the_strategy_with_the_most_gain(tmp_path: Path) -> None:
    """Without the uniform share, a strategy far ahead in gain makes every proposal: here the
    elites' neighbours, so each model-based proposal is one parameter from one of the three
    best measured configurations."""
    study, space, backend = _portfolio_study(tmp_path, portfolio_floor=0.0)
    Runner(study=study, space=space, backend=backend, trials=5, batch_size=1).run()
    study.sampler._gains = np.array([-1e6, -1e6, 0.0])
    Runner(study=study, space=space, backend=backend, trials=12, batch_size=1).run()
    trials = [t for t in study.get_trials() if t.params]
    assert len(trials) == 12
    checked = 0
    for i in range(5, len(trials)):
        done = sorted((t for t in trials[:i] if t.value is not None), key=lambda t: t.value)
        elites = [t.params for t in done[:3]]
        tried = {space.key(t.params) for t in trials[:i]}
        neighbours = [
            c for c in space.enumerate().to_dict("records")
            if space.key(c) not in tried
            and min(sum(c[n] != e[n] for n in space.names) for e in elites) == 1
        ]  # fmt: skip
        if neighbours:
            checked += 1
            differing = min(sum(trials[i].params[n] != e[n] for n in space.names) for e in elites)
            assert differing == 1, (i, trials[i].params, elites)
    assert checked >= 5


@pytest.mark.parametrize("inside", [True, False])
def test_portfolio_explore_false_keeps_exploration_at_its_fixed_share(
    tmp_path: Path, inside: bool
) -> None:
    study, space, backend = _portfolio_study(
        tmp_path, portfolio_explore=inside, explore_share=0.0, portfolio_reward="outcome"
    )
    sampler = study.sampler
    asked: list[bool | None] = []
    choose = sampler._choose

    def spy(*args: Any, **kwargs: Any) -> int:
        asked.append(kwargs.get("explore"))
        return choose(*args, **kwargs)

    sampler._choose = spy
    Runner(study=study, space=space, backend=backend, trials=10, batch_size=1).run()
    assert asked  # the portfolio made proposals
    # inside, exploration nominates at every proposal; outside, at its share: never here
    assert (True in asked) == inside


def test_model_params_reach_the_performance_model(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(space=space, seed=0, n_startup_trials=4,
                               model_params={"full_mean": True, "max_depth": 3})  # fmt: skip
    study = optuna.create_study(direction="minimize", sampler=sampler)
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=8,
           batch_size=1).run()  # fmt: skip
    perf = sampler._fit.perf
    assert perf.full_mean and perf.max_depth == 3 and perf.full_ is not None


def test_forest_below_fits_a_forest_first_and_the_boosted_ensemble_after(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(space=space, seed=0, n_startup_trials=4, forest_below=6)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    kinds: list[tuple[int, str | None]] = []
    refit = sampler._refit

    def spy(*args: Any, **kwargs: Any) -> Any:
        fit = refit(*args, **kwargs)
        kinds.append((len(fit.perf.rows_[0]), fit.perf.forest))  # (ok rows learned, kind)
        return fit

    sampler._refit = spy
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=10,
           batch_size=1).run()  # fmt: skip
    assert {kind for _, kind in kinds} == {"extra", None}  # both phases were reached
    assert all((kind == "extra") == (n_ok < 6) for n_ok, kind in kinds)


def test_feasibility_params_reach_the_failure_classifier(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(
        space=space, seed=0, n_startup_trials=4,
        feasibility_params={"calibration": "sigmoid", "min_child_weight": 0.5},
    )  # fmt: skip
    study = optuna.create_study(direction="minimize", sampler=sampler)
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=8,
           batch_size=1).run()  # fmt: skip
    feas = sampler._fit.feas
    assert feas.calibration == "sigmoid" and feas.min_child_weight == 0.5
    assert feas.seed == sampler._seed


@pytest.mark.parametrize("acquisition", ["ei-members", "ei-kde"])
def test_ensemble_acquisitions_rank_by_the_members_predictions(
    tmp_path: Path, acquisition: str
) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    sampler = SurrogateSampler(space=space, seed=0, n_startup_trials=4, acquisition=acquisition)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=10,
           batch_size=1).run()  # fmt: skip
    fit = sampler._fit
    assert fit.cand_members is not None and fit.cand_members.shape[0] == sampler.n_models
    np.testing.assert_allclose(fit.cand_mean, fit.cand_members.mean(axis=0))
    configs = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(configs) == len(set(configs)) == 10
    with pytest.raises(ValueError, match="acquisition"):
        SurrogateSampler(acquisition="ucb")


def test_portfolio_outcome_reward_credits_the_strategy_that_set_a_new_best() -> None:
    from surrotune.surrogate.sampler import _Observed

    sampler = SurrogateSampler(seed=0, portfolio=True, portfolio_reward="outcome")
    obs = _Observed(values=[5.0, 4.0, None, 4.5, 3.0], numbers=[0, 1, 2, 3, 4])
    # trials 1 (a new best), 2 (failed), 3 (no new best), 4 (a new best) came from the portfolio
    sampler._arm_of = {1: (2, 0.5), 2: (0, 0.25), 3: (1, 0.25), 4: (0, 0.8)}
    sampler._reward_outcomes(obs, "minimize")
    np.testing.assert_allclose(sampler._gains, [1 / 0.8, 0.0, 1 / 0.5])  # 1 / p, EXP3's way
    assert sampler._arm_of == {}  # each outcome counted once
    sampler._arm_of = {3: (1, 0.5)}
    sampler._reward_outcomes(obs, "maximize")  # 5.0 > 4.5: not a new best when maximising
    np.testing.assert_allclose(sampler._gains, [1 / 0.8, 0.0, 1 / 0.5])
    with pytest.raises(ValueError, match="portfolio_reward"):
        SurrogateSampler(portfolio_reward="regret")


def test_explore_share_takes_the_farthest_of_the_candidates_the_model_believes_in() -> None:
    """With explore_share=1 every proposal goes to the candidate farthest from anything
    evaluated among the best-predicted tenth that the feasibility gate lets through."""
    import numpy as np

    sampler = SurrogateSampler(seed=0, explore_share=1.0, explore_top=0.1)
    n = 100
    mean = np.arange(n, dtype=float)  # candidates 0..9 are the believed best tenth
    near = np.zeros(n)
    near[[3, 5, 50]] = [0.4, 0.9, 5.0]  # 50 is far but predicted poor
    p_ok = np.ones(n)
    p_ok[5] = 0.01  # the gate keeps 5 out
    choice = sampler._choose(
        None, None, mean, np.zeros(n), p_ok, near, np.full(n, np.inf), None,  # type: ignore[arg-type]
        np.random.default_rng(0),
    )  # fmt: skip
    assert choice == 3


def test_cap_quantile_flattens_the_slow_end_of_the_training_targets() -> None:
    from surrotune.surrogate.sampler import _Observed

    study = optuna.create_study()
    obs = _Observed()
    obs.values = [float(2**k) for k in range(12)] + [None]
    obs.statuses = ["ok"] * 12 + ["resource"]
    obs.features = [[float(k)] for k in range(13)]
    log = SurrogateSampler(seed=0, objective_scale="log")
    _, ok, _, plain, _ = log._training_set(study, obs)
    capped_log = SurrogateSampler(seed=0, cap_quantile=0.5, objective_scale="log")
    _, _, _, capped, _ = capped_log._training_set(study, obs)
    assert ok.sum() == 12 and len(plain) == len(capped) == 12
    cap = float(np.quantile(plain, 0.5))
    assert np.allclose(capped, np.minimum(plain, cap))  # the fast half keeps its ranking
    assert capped[:6].tolist() == plain[:6].tolist() and (capped[6:] == cap).all()


def test_copula_scale_trains_on_normal_scores_and_keeps_the_best_comparable() -> None:
    """objective_scale="copula" (the default): the models learn the log values' normal scores
    by rank; the incumbent (also one measured after the fit) and the recorded prediction go
    through the same map, so expected improvement compares like with like and the prediction
    attribute stays in the objective's units."""
    from scipy.stats import norm

    from surrotune.surrogate.sampler import _Fit, _Observed

    study = optuna.create_study()
    obs = _Observed()
    obs.values = [1.0, 2.0, 4.0, 1000.0, None]  # one very slow measurement, one failure
    obs.statuses = ["ok"] * 4 + ["resource"]
    obs.features = [[float(k)] for k in range(5)]
    *_, plain, none = SurrogateSampler(seed=0, objective_scale="log")._training_set(study, obs)
    *_, y, scale = SurrogateSampler(seed=0)._training_set(study, obs)  # the copula, by default
    assert none is None and scale is not None
    assert np.allclose(y, norm.ppf((np.arange(4) + 0.5) / 4))  # ranks, not magnitudes
    assert y[3] - y[2] == pytest.approx(y[1] - y[0])  # the slow one is just the next rank
    fit = _Fit(key=None, n=5, n_features=1, perf=None, feas=None, scale=scale)  # type: ignore[arg-type]
    assert fit.best_of(obs) == pytest.approx(y[0])
    obs.values.append(0.5)  # faster than everything fitted: below the fitted scale's end
    assert fit.best_of(obs) < y[0]
    assert fit.to_transformed(float(y[2])) == pytest.approx(plain[2])
    with pytest.raises(ValueError, match="objective_scale"):
        SurrogateSampler(objective_scale="rank")


def test_every_objective_scale_runs_a_study_without_repeats() -> None:
    space = SearchSpace({"a": [1, 2, 4, 8, 16, 32], "b": [1, 2, 4, 8], "c": [0, 1]})

    def objective(trial: optuna.Trial) -> float:
        a, b, c = (trial.suggest_categorical(n, space.values[n]) for n in ("a", "b", "c"))
        return (a - 8) ** 2 + (b - 2) ** 2 + 1.0 + 500.0 * (a == 32) + c

    for scale in ("copula", "power", "log"):
        study = optuna.create_study(
            sampler=SurrogateSampler(space=space, seed=0, objective_scale=scale)
        )
        study.optimize(objective, n_trials=25)
        keys = [tuple(t.params.values()) for t in study.trials]
        assert len(set(keys)) == len(keys), scale
        assert study.best_value == 1.0, scale


def test_alignment_adds_two_columns_per_mixed_width_on_both_paths() -> None:
    """Space path: the candidate table's features gain alignment and power-of-two columns for
    each integer parameter that mixes powers of two with other values; plain-Optuna path: the
    same parameters, read off the distributions."""
    from surrotune.surrogate.features import DistributionEncoder
    from surrotune.surrogate.sampler import _alignment_dist_columns, _Table

    space = SearchSpace({"bx": [16, 32, 48, 64], "tile": [1, 2, 4], "flag": [0, 1]})
    plain = _Table.build(
        space, SurrogateSampler(space=space, alignment=False), np.random.default_rng(0)
    )
    aligned = _Table.build(space, SurrogateSampler(space=space), np.random.default_rng(0))
    assert aligned.features.shape[1] == plain.features.shape[1] + 2
    assert aligned.align_cols == [space.names.index("bx")]
    encoder = DistributionEncoder({
        "bx": optuna.distributions.IntDistribution(16, 256, step=16),
        "tile": optuna.distributions.CategoricalDistribution([1, 2, 4]),
        "odd": optuna.distributions.CategoricalDistribution([1, 3, 4]),
        "x": optuna.distributions.FloatDistribution(0.0, 1.0),
    })  # fmt: skip
    assert [encoder.names[k] for k in _alignment_dist_columns(encoder)] == ["bx", "odd"]
    study = optuna.create_study(
        sampler=SurrogateSampler(seed=0, n_startup_trials=4, pool_size=256)
    )
    study.optimize(
        lambda t: t.suggest_int("bx", 16, 256, step=16) % 64 + t.suggest_float("x", 0, 1),
        n_trials=8,
    )
    assert len({t.params["bx"] for t in study.trials}) > 1


def _design(space: SearchSpace, design_pool: int, seed: int, n: int = 8) -> list[tuple]:
    """The first ``n`` space-filling proposals, every trial told a constant value."""
    sampler = SurrogateSampler(space=space, seed=seed, n_startup_trials=n, design_pool=design_pool)
    study = optuna.create_study(sampler=sampler)
    dists = distributions(space)
    keys = []
    for _ in range(n):
        trial = study.ask(dists)
        keys.append(tuple(sorted(trial.params.items())))
        study.tell(trial, 1.0)
    return keys


def test_design_pool_trades_the_corners_for_a_random_design() -> None:
    """The whole-space maximin design runs to the space's corners (every value of a 1..64
    parameter it picks is an end value, after the random first); a pool of one is a random
    design: seeded, inside the space, never repeated, and mostly off the corners."""
    space = SearchSpace({"a": list(range(1, 65)), "b": list(range(1, 65))})
    corners = {1, 64}
    spread = _design(space, 2048, seed=0)
    assert all(dict(k)["a"] in corners and dict(k)["b"] in corners for k in spread[1:4])
    random_design = _design(space, 1, seed=0)
    assert random_design == _design(space, 1, seed=0)
    assert len(set(random_design)) == len(random_design)
    off_corner = [k for k in random_design if not set(dict(k).values()) <= corners]
    assert len(off_corner) >= 6
    with pytest.raises(ValueError, match="design_pool"):
        SurrogateSampler(space=space, design_pool=0)


def test_maxpro_design_covers_interior_values_in_a_study() -> None:
    """``design_criterion="maxpro"`` in a study: the eight design proposals are seeded, never
    repeated, and spread over interior values where maximin's sit at the corners."""
    space = SearchSpace({"a": list(range(1, 65)), "b": list(range(1, 65))})

    def design(criterion: str, seed: int) -> list[tuple]:
        sampler = SurrogateSampler(
            space=space, seed=seed, n_startup_trials=8, design_criterion=criterion
        )
        study = optuna.create_study(sampler=sampler)
        keys = []
        for _ in range(8):
            trial = study.ask(distributions(space))
            keys.append(tuple(sorted(trial.params.items())))
            study.tell(trial, 1.0)
        return keys

    maxpro = design("maxpro", 0)
    assert maxpro == design("maxpro", 0) and len(set(maxpro)) == 8
    distinct_a = {dict(k)["a"] for k in maxpro}
    assert len(distinct_a) == 8 and len(distinct_a - {1, 64}) >= 5
    with pytest.raises(ValueError, match="design_criterion"):
        SurrogateSampler(space=space, design_criterion="sobol")


def test_refit_every_below_refits_after_each_new_observation_up_to_its_limit() -> None:
    from surrotune.surrogate.sampler import _Fit, _Observed

    def current(refit_every_below: int, n_now: int) -> bool:
        sampler = SurrogateSampler(seed=0, refit_every_below=refit_every_below)
        sampler._fit = _Fit(key="k", n=100, n_features=3, perf=None, feas=None)  # type: ignore[arg-type]
        obs = _Observed(values=[1.0] * n_now)
        return sampler._current_fit(obs, "k", 3) is not None

    assert current(0, 101)  # the growth schedule: 5 % of 100 = 5 more before a refit
    assert not current(0, 105)
    assert not current(300, 101)  # under the limit every new observation refits
    assert current(300, 100)  # nothing new: the fit stands
    assert current(100, 101)  # over the limit: the growth schedule again


def test_marginal_share_proposes_the_values_the_good_trials_share() -> None:
    """TPE's density ratio over the candidates: where the good tenth of the observations is
    (0, 3, 0) and (0, 3, 1) and the rest (failures among them) have neither a=0 nor b=3, the
    marginal choice is the one unevaluated candidate that shares both, (0, 3, 2); where the
    P(ok) gate keeps that one out, it is never proposed."""
    from surrotune.surrogate.sampler import _Fit, _Observed

    space = SearchSpace({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1, 2]}, [])
    sampler = SurrogateSampler(space=space, seed=0, marginal_share=1.0)
    table = sampler._table_for(space)
    configs = table.frame.to_dict("records")
    target = configs.index({"a": 0, "b": 3, "c": 2})
    obs = _Observed()
    for row, c in enumerate(configs):
        if (c["a"], c["b"]) == (0, 3) and c["c"] < 2:  # the good tenth of 20 ok
            value: float | None = 1.0
        elif c["a"] != 0 and c["b"] != 3:
            value = None if c["c"] == 2 else 5.0 + row
        else:
            continue
        obs.keys.append(int(table.keys[row]))
        obs.values.append(value)
    rows = np.array([r for r in range(len(configs)) if int(table.keys[r]) not in obs.keys])
    cand_ok = np.ones(len(configs))
    fit = _Fit(key="k", n=obs.n, n_features=1, perf=None, feas=None, cand_ok=cand_ok)  # type: ignore[arg-type]
    choices = [
        sampler._marginal_choice(table, fit, obs, rows, np.random.default_rng(seed))
        for seed in range(5)
    ]
    assert choices == [target] * 5, [configs[c] for c in choices if c is not None]
    cand_ok[target] = 0.0
    for seed in range(5):
        row = sampler._marginal_choice(table, fit, obs, rows, np.random.default_rng(seed))
        assert row is not None and row in rows and row != target


def test_boundary_score_ranks_the_candidates_next_to_a_failure() -> None:
    """A boundary proposal chooses only among the candidates one step from a failure:
    ``"uncertainty"`` the one whose P(ok) is nearest 0.5, ``"acquisition"`` the one of best
    expected improvement times P(ok); the best candidate off the boundary is never taken."""
    from types import SimpleNamespace

    n = 6
    mean = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # candidate 0 predicted best, off the boundary
    std = np.full(n, 0.5)
    p_ok = np.array([1.0, 0.9, 0.5, 0.95, 1.0, 1.0])
    boundary = np.array([False, True, True, True, False, False])
    fit = SimpleNamespace(
        best_of=lambda obs: 2.5, feas=SimpleNamespace(informative=True), gate=False
    )
    picks = {}
    for score in ("uncertainty", "acquisition"):
        sampler = SurrogateSampler(seed=0, explore_share=0.0, gate_epsilon=0.0,
                                   boundary_score=score)  # fmt: skip
        picks[score] = sampler._choose(
            fit, None, mean, std, p_ok, np.full(n, np.inf), np.full(n, np.inf),  # type: ignore[arg-type]
            boundary, np.random.default_rng(0),
        )  # fmt: skip
        no_boundary = sampler._choose(
            fit, None, mean, std, p_ok, np.full(n, np.inf), np.full(n, np.inf),  # type: ignore[arg-type]
            None, np.random.default_rng(0),
        )  # fmt: skip
        assert no_boundary == 0
    assert picks == {"uncertainty": 2, "acquisition": 1}
    with pytest.raises(ValueError, match="boundary_score"):
        SurrogateSampler(boundary_score="edge")


def test_explore_after_stall_explores_only_once_the_best_stops_improving() -> None:
    """``explore_after_stall`` k: the exploration share is drawn as before but taken only after
    k evaluations without a new best. A search that never stalls within its budget then runs
    exactly as one that never explores; without the condition, a share of 1 changes it."""
    from surrotune.surrogate.sampler import _since_improvement

    assert _since_improvement([3.0, 2.0, None, 2.5], "minimize") == 2
    assert _since_improvement([1.0, 2.0, 3.0], "maximize") == 0
    assert _since_improvement([None, None], "minimize") == 2
    space = SearchSpace({"a": list(range(1, 17)), "b": list(range(1, 17))})

    def run(**options: Any) -> list[tuple]:
        sampler = SurrogateSampler(space=space, seed=4, n_startup_trials=5, **options)
        study = optuna.create_study(sampler=sampler)
        keys = []
        for _ in range(16):
            trial = study.ask(distributions(space))
            params = trial.params
            keys.append((params["a"], params["b"]))
            study.tell(trial, (params["a"] - 11) ** 2 + (params["b"] - 5) ** 2 + 1.0)
        return keys

    never = run(explore_share=1e-12)
    assert run(explore_share=1.0, explore_after_stall=100) == never
    assert run(explore_share=1.0) != never
    with pytest.raises(ValueError, match="explore_after_stall"):
        SurrogateSampler(space=space, explore_after_stall=-1)


def test_design_on_stall_adds_space_filling_points_while_the_best_stands_still() -> None:
    """``design_on_stall`` k: with a best that never improves after the first trial, a
    greedy-maximin point comes at every k-th evaluation without improvement (trials 4 and 7
    for k = 3), up to ``design_on_stall_max``; a search that improves gets none."""
    space = SearchSpace({"a": list(range(1, 65)), "b": list(range(1, 65))})

    def run(objective: Any, **options: Any) -> SurrogateSampler:
        sampler = SurrogateSampler(space=space, seed=1, n_startup_trials=2, **options)
        study = optuna.create_study(sampler=sampler)
        for _ in range(12):
            trial = study.ask(distributions(space))
            study.tell(trial, objective(trial.number))
        return sampler

    flat = run(lambda number: 1.0, design_on_stall=3, design_on_stall_max=2)
    assert flat._stall_designs == {4, 7}
    assert run(lambda number: 100.0 - number, design_on_stall=3)._stall_designs == set()
    assert run(lambda number: 1.0)._stall_designs == set()
    with pytest.raises(ValueError, match="design_on_stall"):
        SurrogateSampler(space=space, design_on_stall=-1)


def test_max_value_entropy_acquisition_runs_a_study_without_repeats_and_is_seeded(
    tmp_path: Path,
) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, [])
    runs = []
    for _ in range(2):
        sampler = SurrogateSampler(space=space, seed=4, n_startup_trials=4, acquisition="mes")
        study = optuna.create_study(direction="minimize", sampler=sampler)
        Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=12,
               batch_size=1).run()  # fmt: skip
        runs.append([tuple(sorted(t.params.items())) for t in study.trials])
    assert len(runs[0]) == len(set(runs[0])) == 12
    assert runs[0] == runs[1]
    assert sampler._fit is not None  # the models were fitted: proposals after the design
