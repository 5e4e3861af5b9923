"""ResidualGP and out_of_bag_residuals, and SurrogateSampler's ``uncertainty`` option."""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
import pytest
from sklearn.exceptions import NotFittedError

from surrotune.space import SearchSpace
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.performance import PerformanceModel
from surrotune.surrogate.residual import ResidualGP, out_of_bag_residuals

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ------------------------------------------------------------------ out_of_bag_residuals


def test_out_of_bag_residuals_average_the_members_that_left_each_row_out() -> None:
    members = np.array([
        [1.0, 2.0, 3.0, 4.0],
        [3.0, 6.0, 5.0, 0.0],
        [5.0, 1.0, 7.0, 2.0],
    ])  # fmt: skip
    out_of_bag = np.array([
        [True, False, False, True],
        [True, False, False, True],
        [False, False, True, True],
    ])  # fmt: skip
    y = [10.0, 20.0, 30.0, 40.0]
    rows, residuals = out_of_bag_residuals(members, out_of_bag, y)
    # row 0: members 0 and 1, (1 + 3) / 2 = 2; row 1 is in every member's bag: left out;
    # row 2: member 2 alone, 7; row 3: all three, (4 + 0 + 2) / 3 = 2
    assert rows.tolist() == [0, 2, 3]
    np.testing.assert_allclose(residuals, [10.0 - 2.0, 30.0 - 7.0, 40.0 - 2.0])


def test_out_of_bag_residuals_are_empty_without_any_out_of_bag_row() -> None:
    members = np.ones((2, 3))
    rows, residuals = out_of_bag_residuals(members, np.zeros((2, 3), dtype=bool), [1, 2, 3])
    assert rows.size == 0 and residuals.size == 0


def test_out_of_bag_residuals_reject_mismatched_shapes() -> None:
    members = np.zeros((3, 4))
    with pytest.raises(ValueError, match="do not match"):
        out_of_bag_residuals(members, np.ones((3, 3), dtype=bool), np.zeros(4))
    with pytest.raises(ValueError, match="do not match"):
        out_of_bag_residuals(members, np.ones((2, 4), dtype=bool), np.zeros(4))
    with pytest.raises(ValueError, match="do not match"):
        out_of_bag_residuals(members, np.ones((3, 4), dtype=bool), np.zeros(5))
    with pytest.raises(ValueError, match="do not match"):  # one member as a 1-D row
        out_of_bag_residuals(np.zeros(3), np.zeros(3, dtype=bool), np.zeros(3))


# ------------------------------------------------------------------ ResidualGP


def _cluster(n: int = 20, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points in the [0, 0.25]^2 corner of the unit square and a smooth error over them."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 0.25, (n, 2))
    return X, np.sin(8 * X[:, 0]) + 0.05 * rng.standard_normal(n)


def test_predict_shapes() -> None:
    X, r = _cluster()
    model = ResidualGP().fit(X, r)
    correction, std = model.predict(np.random.default_rng(1).uniform(size=(7, 2)))
    assert correction.shape == (7,) and std.shape == (7,)
    assert np.isfinite(correction).all() and (std >= 0).all()


def test_std_is_smaller_at_the_measurements_than_far_from_them() -> None:
    X, r = _cluster()
    _, std = ResidualGP().fit(X, r).predict(np.array([[0.12, 0.12], [1.0, 1.0]]))
    assert std[0] < std[1]
    _, at_training = ResidualGP().fit(X, r).predict(X)
    assert at_training.max() < std[1]


def test_correct_mean_false_gives_a_zero_correction_and_the_same_spread() -> None:
    X, r = _cluster()
    probe = np.array([[0.1, 0.2], [0.5, 0.5], [0.9, 0.1]])
    correction, std = ResidualGP(correct_mean=False).fit(X, r).predict(probe)
    assert correction.tolist() == [0.0, 0.0, 0.0]
    full_correction, full_std = ResidualGP(correct_mean=True).fit(X, r).predict(probe)
    np.testing.assert_allclose(std, full_std)  # the option changes the mean only
    assert np.abs(full_correction).max() > 0


def test_correct_mean_learns_a_smooth_error() -> None:
    grid = np.linspace(0.0, 1.0, 5)
    X = np.array([[a, b] for a in grid for b in grid])
    r = 2.0 * (X[:, 0] - 0.5)  # the ensemble too fast on the left, too slow on the right
    correction, _ = ResidualGP().fit(X, r).predict(X)
    nonzero = r != 0
    assert (np.sign(correction[nonzero]) == np.sign(r[nonzero])).all()
    np.testing.assert_allclose(correction, r, atol=0.1)
    # between the grid points, too
    between, _ = ResidualGP().fit(X, r).predict(np.array([[0.125, 0.5], [0.875, 0.5]]))
    np.testing.assert_allclose(between, [-0.75, 0.75], atol=0.1)


def test_predict_before_fit_raises_not_fitted() -> None:
    with pytest.raises(NotFittedError):
        ResidualGP().predict(np.zeros((1, 2)))


def test_fit_rejects_one_row_and_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="at least 2 rows"):
        ResidualGP().fit(np.zeros((1, 2)), np.zeros(1))
    with pytest.raises(ValueError, match="one row per residual"):
        ResidualGP().fit(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="2-D"):
        ResidualGP().fit(np.zeros(3), np.zeros(3))


def test_a_constant_column_is_dropped() -> None:
    X, r = _cluster()
    with_constant = np.column_stack([X, np.full(len(X), 0.5)])
    model = ResidualGP().fit(with_constant, r)
    assert model.columns_.tolist() == [0, 1]
    probe = np.random.default_rng(2).uniform(size=(5, 2))
    # the constant column's value at prediction time does not matter
    correction, std = model.predict(np.column_stack([probe, np.full(5, 0.9)]))
    plain_correction, plain_std = ResidualGP().fit(X, r).predict(probe)
    np.testing.assert_allclose(correction, plain_correction)
    np.testing.assert_allclose(std, plain_std)


def test_all_constant_columns_are_kept() -> None:
    model = ResidualGP().fit(np.full((4, 2), 0.5), np.array([0.1, -0.1, 0.2, -0.2]))
    assert model.columns_.tolist() == [0, 1]
    correction, std = model.predict(np.full((2, 2), 0.5))
    assert np.isfinite(correction).all() and np.isfinite(std).all()


def test_max_rows_fits_a_seeded_subset() -> None:
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(60, 3))
    r = np.sin(4 * X[:, 0]) + X[:, 1]
    probe = rng.uniform(size=(10, 3))
    first = ResidualGP(max_rows=20, seed=1).fit(X, r)
    second = ResidualGP(max_rows=20, seed=1).fit(X, r)
    assert first.gp_.X_train_.shape == (20, 3)
    # the subset is drawn from the rows given, each once
    original = {tuple(row) for row in X}
    assert {tuple(row) for row in first.gp_.X_train_} <= original
    assert len({tuple(row) for row in first.gp_.X_train_}) == 20
    for a, b in zip(first.predict(probe), second.predict(probe), strict=True):
        np.testing.assert_array_equal(a, b)
    other = ResidualGP(max_rows=20, seed=2).fit(X, r)
    assert not np.array_equal(first.gp_.X_train_, other.gp_.X_train_)
    assert ResidualGP(max_rows=60).fit(X, r).gp_.X_train_.shape == (60, 3)


def _theta(model: ResidualGP) -> np.ndarray:
    return np.asarray(model.gp_.kernel_.theta)


def test_a_refit_keeps_the_previous_hyperparameters_until_the_rows_grow() -> None:
    """Given the last refit's GP, its fitted kernel stands (no likelihood optimisation) while
    the rows grow by under ``refit_growth``; the posterior is computed on the new rows. Past it,
    the hyperparameters are fitted again."""
    X, r = _cluster(40, seed=4)
    first = ResidualGP(refit_growth=0.25).fit(X[:20], r[:20])
    assert first.fitted_rows_ == 20
    grown = ResidualGP(refit_growth=0.25).fit(X[:24], r[:24], previous=first)
    np.testing.assert_array_equal(_theta(grown), _theta(first))
    assert grown.fitted_rows_ == 20
    assert grown.gp_.X_train_.shape == (24, 2)  # the posterior has the new rows
    fresh = ResidualGP(refit_growth=0.25).fit(X[:24], r[:24])
    assert not np.allclose(_theta(fresh), _theta(first))  # a likelihood fit would move them
    again = ResidualGP(refit_growth=0.25).fit(X[:25], r[:25], previous=grown)
    assert again.fitted_rows_ == 25
    np.testing.assert_allclose(_theta(again), _theta(ResidualGP().fit(X[:25], r[:25])))


def test_without_the_schedule_or_with_other_columns_the_hyperparameters_are_fitted() -> None:
    X, r = _cluster(30, seed=5)
    first = ResidualGP().fit(X[:20], r[:20])
    every = ResidualGP(refit_growth=0.0).fit(X[:21], r[:21], previous=first)
    assert every.fitted_rows_ == 21
    np.testing.assert_allclose(_theta(every), _theta(ResidualGP().fit(X[:21], r[:21])))
    # the out-of-bag rows can shrink between refits: without the schedule they are fitted too
    fewer = ResidualGP(refit_growth=0.0).fit(X[:19], r[:19], previous=every)
    assert fewer.fitted_rows_ == 19
    # a column that was constant now varies: the length scales cannot be taken over
    constant = np.column_stack([X[:20], np.full(20, 0.5)])
    before = ResidualGP().fit(constant, r[:20])
    varying = np.column_stack([X[:21], np.r_[np.full(20, 0.5), 0.9]])
    after = ResidualGP().fit(varying, r[:21], previous=before)
    assert after.columns_.tolist() == [0, 1, 2] and after.fitted_rows_ == 21
    with pytest.raises(ValueError, match="refit_growth"):
        ResidualGP(refit_growth=-1.0)


# ------------------------------------------------------------------ the sampler's option


def objective(trial: optuna.Trial) -> float:
    a = trial.suggest_int("a", 0, 15)
    b = trial.suggest_categorical("b", ["w", "x", "y", "z"])
    if a >= 12 and b == "z":
        raise RuntimeError("planted failure")  # a FAIL trial without a status attribute
    return (a - 5) ** 2 + 3.0 * (b == "y") + 1.0


def plain_study(uncertainty: str, seed: int = 0, trials: int = 40) -> optuna.Study:
    sampler = SurrogateSampler(
        seed=seed, uncertainty=uncertainty, n_startup_trials=6, pool_size=256
    )
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=trials, catch=(RuntimeError,))
    return study


@pytest.mark.parametrize("uncertainty", ["gp", "gp-spread"])
def test_plain_study_runs_without_repeats_and_is_deterministic(uncertainty: str) -> None:
    study = plain_study(uncertainty)
    trials = study.trials
    assert len(trials) == 40
    assert any(t.state == optuna.trial.TrialState.FAIL for t in trials)  # failures were learned
    keys = [tuple(sorted(t.params.items())) for t in trials]
    assert len(keys) == len(set(keys))  # no configuration twice
    assert study.best_value == 1.0
    sampler = study.sampler
    assert isinstance(sampler, SurrogateSampler)
    residual = sampler._fit.residual
    assert isinstance(residual, ResidualGP)
    assert residual.correct_mean == (uncertainty == "gp")
    assert keys == [tuple(sorted(t.params.items())) for t in plain_study(uncertainty).trials]


def test_plain_study_with_the_ensemble_fits_no_residual_gp() -> None:
    study = plain_study("ensemble", trials=20)
    assert study.sampler._fit.residual is None


@pytest.mark.parametrize("uncertainty", ["gp", "gp-spread"])
def test_plain_study_ranks_by_the_gp_spread(
    uncertainty: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the residual GP is fitted, the spread that reaches the acquisition is the GP's;
    the ensemble's mean is corrected by the GP's mean for "gp" and left alone for
    "gp-spread"."""
    ensemble: list[np.ndarray] = []
    predicted: list[tuple[np.ndarray, np.ndarray]] = []
    chosen: list[tuple[np.ndarray, np.ndarray]] = []
    perf_predict = PerformanceModel.predict
    gp_predict = ResidualGP.predict

    def record_perf(self: PerformanceModel, X: np.ndarray, **kwargs: Any) -> Any:
        out = perf_predict(self, X, **kwargs)
        ensemble.append(out[0] if kwargs.get("return_std") else out)
        return out

    def record_gp(self: ResidualGP, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = gp_predict(self, encoded)
        predicted.append(out)
        return out

    monkeypatch.setattr(PerformanceModel, "predict", record_perf)
    monkeypatch.setattr(ResidualGP, "predict", record_gp)
    sampler = SurrogateSampler(seed=0, uncertainty=uncertainty, n_startup_trials=6,
                               pool_size=256)  # fmt: skip
    choose = sampler._choose

    def record_choose(fit: Any, obs: Any, mean: np.ndarray, std: np.ndarray,
                      *args: Any, **kwargs: Any) -> int:  # fmt: skip
        if fit.residual is not None:
            chosen.append((mean, std))
        else:
            ensemble.pop()  # a proposal from the ensemble alone
        return choose(fit, obs, mean, std, *args, **kwargs)

    sampler._choose = record_choose  # type: ignore[method-assign]
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=30, catch=(RuntimeError,))
    assert chosen and len(chosen) == len(predicted) == len(ensemble)
    for (mean, std), (correction, gp_std), trees in zip(chosen, predicted, ensemble, strict=True):
        assert std is gp_std
        assert (correction != 0).any() == (uncertainty == "gp")
        np.testing.assert_allclose(mean, trees + correction)


def test_too_few_out_of_bag_errors_leave_the_ensemble_spread() -> None:
    """Below eight out-of-bag errors no GP is fitted (the ensemble's spread is used): the last
    proposal of eight trials is made from seven learned ones, so at most seven errors."""
    study = plain_study("gp", trials=8)
    sampler = study.sampler
    assert sampler._fit is not None and sampler._fit.n == 7
    assert sampler._fit.residual is None


@pytest.mark.parametrize("uncertainty", ["ensemble", "gp", "gp-spread"])
def test_space_study_uses_the_gp_over_the_candidate_table(uncertainty: str) -> None:
    space = SearchSpace({"a": [1, 2, 4, 8, 16, 32], "b": [1, 2, 4, 8], "c": [0, 1]})

    def objective(trial: optuna.Trial) -> float:
        a, b, c = (trial.suggest_categorical(n, space.values[n]) for n in ("a", "b", "c"))
        return (a - 8) ** 2 + (b - 2) ** 2 + 1.0 + 500.0 * (a == 32) + c

    def run() -> tuple[SurrogateSampler, list[tuple]]:
        sampler = SurrogateSampler(space=space, seed=0, uncertainty=uncertainty)
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=25)
        return sampler, [tuple(t.params.values()) for t in study.trials]

    sampler, keys = run()
    assert len(set(keys)) == len(keys) == 25
    assert keys == run()[1]  # deterministic for a seed
    fit = sampler._fit
    if uncertainty == "ensemble":
        assert fit.residual is None
        np.testing.assert_allclose(fit.cand_std, fit.cand_members.std(axis=0))
        return
    assert isinstance(fit.residual, ResidualGP)
    assert fit.residual.correct_mean == (uncertainty == "gp")
    correction, gp_std = fit.residual.predict(sampler._table.encoded)
    np.testing.assert_allclose(fit.cand_std, gp_std)  # the GP's spread replaces the trees'
    members = fit.perf.predict_members(fit.augment(sampler._table.features))
    np.testing.assert_allclose(fit.cand_mean, members.mean(axis=0) + correction)
    np.testing.assert_allclose(fit.cand_members, members + correction)


def test_unknown_uncertainty_is_rejected() -> None:
    with pytest.raises(ValueError, match="uncertainty") as info:
        SurrogateSampler(uncertainty="bogus")
    assert "bogus" in str(info.value)


@pytest.mark.parametrize("acquisition", ["ei-members", "ei-kde"])
def test_gp_uncertainty_needs_plain_expected_improvement(acquisition: str) -> None:
    """The member-based acquisitions never read the GP's spread: ``gp-spread`` with them is
    refused, not silently fitted and ignored."""
    with pytest.raises(ValueError, match="needs acquisition='ei'"):
        SurrogateSampler(uncertainty="gp-spread", acquisition=acquisition)
    # the default ("gp") corrects the members' mean, which they do read; the ensemble as before
    assert SurrogateSampler(acquisition=acquisition).uncertainty == "gp"
    SurrogateSampler(uncertainty="ensemble", acquisition=acquisition)
    # max-value entropy search reads the mean and spread as EI does, the GP's spread included
    assert SurrogateSampler(uncertainty="gp-spread", acquisition="mes").acquisition == "mes"


# ------------------------------------------------------------------ Thompson sampling


def test_sample_deviation_has_the_predicted_spread_and_correlates_neighbours() -> None:
    X, r = _cluster(n=30)
    model = ResidualGP().fit(X, r)
    probe = np.array([[0.6, 0.6], [0.61, 0.6], [0.12, 0.12], [1.0, 0.0]])
    _, std = model.predict(probe)
    rng = np.random.default_rng(0)
    draws = np.array([model.sample_deviation(probe, rng) for _ in range(4000)])
    assert draws.shape == (4000, 4)
    np.testing.assert_allclose(draws.mean(axis=0), 0.0, atol=4 * std.max() / np.sqrt(4000))
    np.testing.assert_allclose(draws.std(axis=0), std, rtol=0.1, atol=1e-3)
    corr = np.corrcoef(draws[:, [0, 1, 3]].T)
    assert corr[0, 1] > 0.95  # two neighbours move together
    assert corr[0, 1] > abs(corr[0, 2]) + 0.3  # a far point much less


def test_sample_deviation_is_reproducible_for_a_generator_and_needs_a_fit() -> None:
    X, r = _cluster()
    model = ResidualGP().fit(X, r)
    probe = np.random.default_rng(3).uniform(size=(50, 2))
    a = model.sample_deviation(probe, np.random.default_rng(7))
    b = model.sample_deviation(probe, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(NotFittedError):
        ResidualGP().sample_deviation(probe, np.random.default_rng(0))


class _NoResidual:
    residual = None


def test_thompson_choice_takes_the_best_of_one_member_among_the_open_candidates() -> None:
    """Gate (P(ok) under the threshold) and pending configurations are left out; among the
    rest, the drawn member's best. With one member the draw is that member."""
    sampler = SurrogateSampler(seed=0, thompson_share=1.0, gate_threshold=0.1)
    mean = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    members = np.array([[5.0, 0.0, 1.0, 2.0, -1.0]])
    p_ok = np.array([1.0, 1.0, 1.0, 1.0, 0.05])  # the member's best is gated out
    pending = np.array([np.inf, 0.0, np.inf, np.inf, np.inf])  # its second best is pending
    choice = sampler._thompson_choice(
        _NoResidual(), mean, np.zeros(5), p_ok, members, np.zeros((5, 2)), pending,
        np.random.default_rng(0),
    )  # fmt: skip
    assert choice == 2
    nothing_open = sampler._thompson_choice(
        _NoResidual(), mean, np.zeros(5), np.zeros(5), members, np.zeros((5, 2)), pending,
        np.random.default_rng(0),
    )  # fmt: skip
    assert nothing_open is None


def test_thompson_pool_keeps_the_lowest_lower_confidence_bounds() -> None:
    """Only the ``thompson_pool`` candidates of lowest mean - 2 std are drawn from: a member
    that prefers a candidate outside the pool cannot choose it."""
    sampler = SurrogateSampler(seed=0, thompson_share=1.0, thompson_pool=2)
    mean = np.array([0.0, 0.5, 3.0, 1.0])
    std = np.array([0.0, 0.0, 0.0, 1.0])  # lower bounds 0, 0.5, 3, -1: the pool is rows 3, 0
    members = np.array([[0.2, 0.1, -9.0, 0.3]])
    choice = sampler._thompson_choice(
        _NoResidual(), mean, std, np.ones(4), members, np.zeros((4, 2)), np.full(4, np.inf),
        np.random.default_rng(0),
    )  # fmt: skip
    assert choice == 0


def test_thompson_share_is_validated() -> None:
    with pytest.raises(ValueError, match="thompson_share"):
        SurrogateSampler(thompson_share=1.5)
    with pytest.raises(ValueError, match="thompson_pool"):
        SurrogateSampler(thompson_pool=0)


@pytest.mark.parametrize("with_space", [True, False])
def test_a_study_with_thompson_share_draws_and_never_repeats(
    with_space: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    space = SearchSpace(
        {"a": [1, 2, 4, 8, 16, 32], "b": [1, 2, 4, 8], "c": [0, 1]}, constraints=["a * b <= 64"]
    )

    def objective(trial: optuna.Trial) -> float:
        a, b, c = (trial.suggest_categorical(n, space.values[n]) for n in ("a", "b", "c"))
        return (a - 8) ** 2 + (b - 2) ** 2 + 1.0 + c

    draws: list[int | None] = []
    choose = SurrogateSampler._thompson_choice

    def record(self: SurrogateSampler, *args: Any) -> int | None:
        out = choose(self, *args)
        draws.append(out)
        return out

    monkeypatch.setattr(SurrogateSampler, "_thompson_choice", record)

    def run() -> list[tuple]:
        sampler = SurrogateSampler(
            space=space if with_space else None, seed=0, thompson_share=0.5, pool_size=256
        )
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=30)
        return [tuple(t.params[n] for n in ("a", "b", "c")) for t in study.trials]

    keys = run()
    assert len(set(keys)) == len(keys) == 30
    assert any(d is not None for d in draws)  # Thompson draws chose proposals
    if with_space:
        assert all(a * b <= 64 for a, b, _ in keys)
    assert keys == run()  # deterministic for a seed


def test_by_default_every_refit_fits_the_hyperparameters() -> None:
    X, r = _cluster(30, seed=6)
    first = ResidualGP().fit(X[:20], r[:20])
    assert ResidualGP().fit(X[:21], r[:21], previous=first).fitted_rows_ == 21


def test_the_sampler_refits_the_gp_on_its_last_hyperparameters_between_schedules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each refit hands the GP the last one; most refits keep its hyperparameters, and every
    one that keeps them has fewer than 25 % more rows than they were fitted on."""
    kept: list[tuple[int, int]] = []
    fit = ResidualGP.fit

    def spy(self: ResidualGP, encoded: Any, residuals: Any, previous: Any = None) -> ResidualGP:
        model = fit(self, encoded, residuals, previous=previous)
        kept.append((model.fitted_rows_, len(model.gp_.X_train_)))
        return model

    monkeypatch.setattr(ResidualGP, "fit", spy)
    sampler = SurrogateSampler(
        seed=0, n_startup_trials=6, pool_size=256, residual_params={"refit_growth": 0.25}
    )
    optuna.create_study(sampler=sampler).optimize(objective, n_trials=60, catch=(RuntimeError,))
    reused = [(rows, n) for rows, n in kept if rows < n]
    assert len(kept) >= 5 and reused
    assert all(n < rows * 1.25 for rows, n in reused)
