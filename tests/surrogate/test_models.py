"""The pure parts of the surrogate: features, performance and feasibility models, acquisition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from surrotune.space import SearchSpace
from surrotune.surrogate.acquisition import (
    acquisition_scores,
    boundary_scores,
    ensemble_expected_improvement,
    expected_improvement,
    feasibility_gate,
    max_value_entropy,
    minimum_draws,
    value_entropy_gain,
)
from surrotune.surrogate.diversity import (
    greedy_maximin,
    greedy_maxpro,
    min_distances,
    proximity,
)
from surrotune.surrogate.feasibility import FeasibilityModel
from surrotune.surrogate.features import (
    FEATURES_VERSION,
    alignment_columns,
    alignment_features,
    make_features,
    pairwise_features,
    positive_columns,
    raw_values,
)
from surrotune.surrogate.performance import (
    CopulaScale,
    PerformanceModel,
    PowerScale,
    transform_objective,
)


def planted_space() -> SearchSpace:
    return SearchSpace({"a": [1, 2, 4, 8, 16, 32], "b": [1, 2, 4, 8, 16, 32], "c": [0, 1]})


def features_of(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    frame = space.enumerate()
    index = space.index_of(frame)
    raw = raw_values(space, index)
    return make_features(space.encode(frame), raw, pair_columns=positive_columns(raw)), raw


# ----------------------------------------------------------------------------- features


def test_pairwise_features_are_log_products_and_ratios() -> None:
    raw = np.array([[2.0, 8.0, 0.0], [4.0, 4.0, 1.0]])
    assert positive_columns(raw) == [0, 1]  # a column holding 0 cannot be logged
    pairs = pairwise_features(raw)
    np.testing.assert_allclose(pairs, [[4.0, -2.0], [4.0, 0.0]])  # log2(a*b), log2(a/b)
    assert isinstance(FEATURES_VERSION, int)


def test_features_have_encoded_then_pairs() -> None:
    space = planted_space()
    X, raw = features_of(space)
    assert X.dtype == np.float32
    assert X.shape == (72, 3 + 2)  # a, b, c encoded + log2(a*b), log2(a/b)
    np.testing.assert_allclose(X[:, 3], np.log2(raw[:, 0] * raw[:, 1]))


# ------------------------------------------------------------------------ performance


def test_transform_objective_makes_lower_better() -> None:
    np.testing.assert_allclose(transform_objective(np.array([1.0, math.e]), "minimize"), [0, 1])
    np.testing.assert_allclose(transform_objective(np.array([1.0, math.e]), "maximize"), [0, -1])
    np.testing.assert_allclose(transform_objective(np.array([-1.0, 2.0]), "minimize"), [-1, 2])
    with pytest.raises(ValueError, match="direction"):
        transform_objective(np.array([1.0]), "up")


def test_copula_scale_maps_ranks_to_normal_scores_and_back() -> None:
    y = np.log(np.array([3.0, 1.0, 2.0, 2.0, 500.0]))
    scale = CopulaScale().fit(y)
    # ranks 4, 1, 2.5, 2.5, 5 of 5: the normal's quantiles at (rank - 0.5) / 5
    expected = [0.5244005, -1.2815516, -0.2533471, -0.2533471, 1.2815516]
    assert np.allclose(scale.transform(y), expected, atol=1e-6)
    assert np.allclose(scale.inverse(scale.transform(y)), y)
    # beyond the fitted values the line goes on with the whole range's slope, both ways
    outside = np.log(np.array([0.5, 1000.0]))
    z = scale.transform(outside)
    assert z[0] < -1.2815516 and z[1] > 1.2815516
    assert np.allclose(scale.inverse(z), outside)
    between = np.log(np.array([1.5]))  # interpolated between ranks 1 and 2.5
    assert -1.2815516 < float(scale.transform(between)[0]) < -0.2533471
    with pytest.raises(NotFittedError):
        CopulaScale().transform(y)
    flat = CopulaScale().fit(np.array([2.0, 2.0]))  # one value: every score 0, slope 1
    assert flat.transform(np.array([2.0, 1.0])).tolist() == [0.0, -1.0]


def test_power_scale_pulls_a_slow_tail_in_and_keeps_the_order() -> None:
    """Yeo-Johnson on log times with one configuration 200x slower: the fitted exponent is
    below 1, so the slow one ends nearer the rest (in standard deviations) than on the plain
    standardised log; the order is kept and the inverse undoes the transform."""
    y = np.log(np.array([1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0, 200.0]))
    scale = PowerScale().fit(y)
    z = scale.transform(y)
    assert float(scale.transformer_.lambdas_[0]) < 1.0
    assert (np.diff(z) > 0).all()
    plain = (y - y.mean()) / y.std()
    assert z[-1] < plain[-1]  # the outlier is pulled in
    assert np.allclose(scale.inverse(z), y)
    with pytest.raises(NotFittedError):
        PowerScale().transform(y)


def test_performance_model_contract_and_fit() -> None:
    model = PerformanceModel(n_models=4, seed=3)
    with pytest.raises(NotFittedError):
        model.predict(np.zeros((1, 2)))
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(120, 2))
    y = 3 * X[:, 0] - 2 * X[:, 1]
    assert model.fit(X, y) is model
    mean, std = model.predict(X, return_std=True)
    assert np.corrcoef(mean, y)[0, 1] > 0.95
    assert std.shape == (120,) and (std >= 0).all() and std.max() > 0
    again = PerformanceModel(n_models=4, seed=3).fit(X, y).predict(X)
    np.testing.assert_array_equal(mean, again)  # deterministic for a seed
    with pytest.raises(ValueError, match="features"):
        model.predict(np.zeros((1, 3)))


def test_full_mean_keeps_a_lone_fast_measurement_that_bootstrap_members_miss() -> None:
    """With ``full_mean`` the mean is a member fitted on every row, the spread the bootstrap
    members'; a configuration measured much faster than its neighbours stays predicted fast."""
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(60, 3))
    y = X.sum(axis=1)
    X[0] = [0.5, 0.5, 0.5]
    y[0] = -3.0  # the lone optimum: every neighbour is near 1.5
    plain = PerformanceModel(n_models=5, seed=0).fit(X, y)
    full = PerformanceModel(n_models=5, seed=0, full_mean=True).fit(X, y)
    # a bootstrap member leaves the optimum out with probability (1 - 1/60)^60, about 1/e
    assert full.predict(X[:1])[0] < plain.predict(X[:1])[0]
    assert abs(full.predict(X[:1])[0] - y[0]) < 0.5
    mean, std = full.predict(X, return_std=True)
    members = full.predict_members(X)
    np.testing.assert_allclose(members.mean(axis=0), mean)  # moved onto the full member
    np.testing.assert_allclose(members.std(axis=0), std)
    np.testing.assert_allclose(std, plain.predict(X, return_std=True)[1])  # spread unchanged
    assert full.out_of_bag(len(y)).shape == (5, 60)
    loaded = PerformanceModel.from_state(full.get_state())
    np.testing.assert_array_equal(loaded.predict_members(X), members)


@pytest.mark.parametrize("forest", ["extra", "random"])
def test_forest_members_are_trees_on_their_own_bootstrap_resamples(forest: str) -> None:
    """``forest``: every tree a member, each on its own resample (so out-of-bag errors, which
    the residual GP learns, are honest ones), deterministic for a seed; it cannot be saved."""
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(80, 3))
    y = 3 * X[:, 0] - 2 * X[:, 1]
    model = PerformanceModel(forest=forest, n_trees=12, seed=4).fit(X, y)
    members = model.predict_members(X)
    assert members.shape == (12, 80)
    mean, std = model.predict(X, return_std=True)
    assert np.corrcoef(mean, y)[0, 1] > 0.95 and std.max() > 0
    out = model.out_of_bag(len(y))
    assert out.shape == (12, 80) and 0.25 < out.mean() < 0.5  # (1 - 1/n)^n, about 0.37
    k = 3
    in_bag = np.flatnonzero(~out[k])
    assert np.abs(members[k, in_bag] - y[in_bag]).max() < 1e-9  # a full tree fits its rows
    again = PerformanceModel(forest=forest, n_trees=12, seed=4).fit(X, y).predict_members(X)
    np.testing.assert_array_equal(members, again)
    with pytest.raises(ValueError, match="cannot be saved"):
        model.get_state()
    with pytest.raises(ValueError, match="forest must be"):
        PerformanceModel(forest="boosted").fit(X, y)


def test_mix_members_average_a_booster_and_a_forest_on_the_same_resample() -> None:
    rng = np.random.default_rng(5)
    X = rng.uniform(size=(60, 3))
    y = 2 * X[:, 0] + X[:, 2]
    mix = PerformanceModel(forest="mix", n_models=4, n_trees=20, seed=1).fit(X, y)
    plain = PerformanceModel(n_models=4, seed=1).fit(X, y)
    assert len(mix.mix_) == 4 and all(len(f.estimators_) == 5 for f in mix.mix_)
    np.testing.assert_array_equal(mix.out_of_bag(60), plain.out_of_bag(60))  # same resamples
    forests = np.stack([f.predict(X) for f in mix.mix_]) * mix.y_scale_ + mix.y_mean_
    np.testing.assert_allclose(
        mix.predict_members(X), 0.5 * (plain.predict_members(X) + forests), rtol=1e-6
    )
    with pytest.raises(ValueError, match="cannot be saved"):
        mix.get_state()


# ------------------------------------------------------------------------ feasibility


def test_classifier_learns_a_planted_failure_region() -> None:
    space = planted_space()
    X, raw = features_of(space)
    fails = raw[:, 0] * raw[:, 1] > 64  # the region: a * b > 64
    rng = np.random.default_rng(1)
    train = rng.choice(len(X), 60, replace=False)
    model = FeasibilityModel(seed=0).fit(X[train], ~fails[train])
    # the default is the booster's own probabilities, not Platt-scaled ones
    assert model.informative and not model.calibrated_ and model.shrink_ == 1.0
    p_ok = model.predict_ok(X)
    np.testing.assert_allclose(p_ok, model.estimator_.predict_proba(X)[:, 0], rtol=1e-6)
    assert p_ok[fails].mean() < 0.3 and p_ok[~fails].mean() > 0.7
    accuracy = ((p_ok > 0.5) == ~fails).mean()
    assert accuracy > 0.9


def test_platt_scaling_and_leaf_size_are_options() -> None:
    space = planted_space()
    X, raw = features_of(space)
    fails = raw[:, 0] * raw[:, 1] > 64
    rng = np.random.default_rng(1)
    train = rng.choice(len(X), 60, replace=False)
    platt = FeasibilityModel(seed=0, calibration="sigmoid").fit(X[train], ~fails[train])
    assert platt.informative and platt.calibrated_
    p_ok = platt.predict_ok(X)
    assert p_ok[fails].mean() < 0.3 and p_ok[~fails].mean() > 0.7
    assert ((p_ok > 0.5) == ~fails).mean() > 0.9
    # a leaf may hold less: the region's edge is drawn from fewer failures
    sharp = FeasibilityModel(seed=0, min_child_weight=0.1)
    assert sharp.fit(X[train], ~fails[train]).estimator_.get_params()["min_child_weight"] == 0.1
    # few failures: trusted in proportion to them, never more than fully
    few = np.zeros(60, dtype=bool)
    few[:2] = True
    shrunk = FeasibilityModel(seed=0).fit(X[train], ~few)
    assert shrunk.shrink_ == pytest.approx(2 / 8)
    with pytest.raises(ValueError, match="calibration"):
        FeasibilityModel(calibration="isotonic")


def test_classifier_with_one_class_is_a_constant_prior() -> None:
    with pytest.raises(NotFittedError):
        FeasibilityModel().predict_ok(np.zeros((1, 2)))
    model = FeasibilityModel().fit(np.zeros((8, 2)), np.ones(8, dtype=bool))
    assert not model.informative
    np.testing.assert_allclose(model.predict_ok(np.ones((3, 2))), 9 / 10)
    model = FeasibilityModel().fit(np.zeros((3, 2)), np.zeros(3, dtype=bool), ["compile"] * 3)
    np.testing.assert_allclose(model.predict_ok(np.ones((1, 2))), 1 / 5)
    assert model.status_counts_["compile"] == 3


# ------------------------------------------------------------------------- acquisition


def test_expected_improvement_matches_hand_computed_values() -> None:
    # best 1, mean 0.5, std 0.5: z = 1, EI = 0.5 * Phi(1) + 0.5 * phi(1)
    phi1 = math.exp(-0.5) / math.sqrt(2 * math.pi)
    Phi1 = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    ei = expected_improvement(np.array([0.5, 2.0, 0.25]), np.array([0.5, 0.0, 0.0]), 1.0)
    np.testing.assert_allclose(ei, [0.5 * Phi1 + 0.5 * phi1, 0.0, 0.75])
    assert ei[0] == pytest.approx(0.5416, abs=1e-4)
    # the margin xi shifts the incumbent
    assert expected_improvement(np.array([0.25]), np.array([0.0]), 1.0, xi=0.5)[0] == 0.25


def test_ensemble_expected_improvement_follows_the_members_not_a_normal() -> None:
    # columns: four members at the incumbent and one far slower (two camps around a lone slow
    # measurement); five members spread evenly below and above it; all five below it
    members = np.array([
        [0.0, -0.2, -1.0], [0.0, -0.1, -1.0], [0.0, 0.0, -1.0], [0.0, 0.1, -1.0], [3.0, 0.2, -1.0]
    ])  # fmt: skip
    empirical = ensemble_expected_improvement(members, 0.0, smoothing=False)
    np.testing.assert_allclose(empirical, [0.0, (0.2 + 0.1) / 5, 1.0])
    kde = ensemble_expected_improvement(members, 0.0)
    normal = expected_improvement(members.mean(axis=0), members.std(axis=0), 0.0)
    # the normal of the members' spread promises improvement that no member predicts ...
    assert normal[0] > 0.2
    # ... the members' density does not (the interquartile range, so the bandwidth, is 0)
    assert kde[0] == 0.0
    # where they spread evenly the density is smooth: more than the empirical average, which
    # ignores that a member between two others could be lower still
    q75, q25 = np.percentile(members[:, 1], [75, 25])
    h = 0.9 * min(members[:, 1].std(), (q75 - q25) / 1.34) * 5**-0.2
    by_hand = np.mean([expected_improvement(np.array([m]), np.array([h]), 0.0)[0]
                       for m in members[:, 1]])  # fmt: skip
    assert kde[1] == pytest.approx(by_hand) and kde[1] > empirical[1]
    assert kde[2] == pytest.approx(1.0)  # members agree: the plain improvement
    assert ensemble_expected_improvement(members, 0.0, xi=0.5)[2] == pytest.approx(0.5)


def test_minimum_draws_invert_the_independent_minimums_distribution() -> None:
    from scipy.stats import norm

    rng = np.random.default_rng(3)
    mean, std = rng.normal(0.0, 1.0, 500), rng.uniform(0.05, 1.0, 500)
    draws = minimum_draws(mean, std, 10.0, np.random.default_rng(7), 16)
    u = np.sort(np.random.default_rng(7).random(16))  # the quantiles the draws were taken at
    # P(min <= draw) = 1 - prod_i P(Y_i > draw), by hand at each draw
    cdf = 1.0 - np.prod(norm.sf(draws[:, None], loc=mean[None, :], scale=std[None, :]), axis=1)
    np.testing.assert_allclose(cdf, u, atol=1e-3)
    assert np.all(np.diff(draws) >= 0)
    # no draw lies above what was already measured: the minimum is at most the best
    capped = minimum_draws(mean, std, float(np.min(mean)) - 3.0, np.random.default_rng(7), 16)
    assert np.all(capped <= np.min(mean) - 3.0)


def test_value_entropy_gain_matches_hand_computed_values() -> None:
    # one draw y* = 0; mean 1, std 1: g = 1, gain = phi(1) / (2 Phi(1)) - log Phi(1)
    phi1 = math.exp(-0.5) / math.sqrt(2 * math.pi)
    Phi1 = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    gain = value_entropy_gain(np.array([1.0, 1.0, 5.0]), np.array([1.0, 0.0, 1.0]),
                              np.array([0.0]))  # fmt: skip
    assert gain[0] == pytest.approx(phi1 / (2 * Phi1) - math.log(Phi1))
    assert gain[1] == 0.0  # no spread: measuring it teaches nothing
    assert 0.0 < gain[2] < gain[0]  # far above the minimum: little to learn


def test_max_value_entropy_prefers_a_wide_poor_candidate_that_ei_ranks_last() -> None:
    # many candidates a little below the best, precisely known, and one far worse on average
    # but wide: EI prefers the sure small gain, MES the candidate that may hold the minimum
    mean = np.concatenate([np.full(200, -0.1), [1.0]])
    std = np.concatenate([np.full(200, 0.05), [1.0]])
    ei = expected_improvement(mean, std, 0.0)
    mes = max_value_entropy(mean, std, 0.0, np.random.default_rng(0))
    assert np.argmax(ei) < 200 and ei[200] < ei[:200].min()
    assert np.argmax(mes) == 200
    assert np.all(mes >= 0.0)


def test_acquisition_multiplies_p_ok_and_subtracts_the_penalty() -> None:
    scores = acquisition_scores(
        np.array([2.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.25]), np.array([0.0, 0.5, 0.0]),
        weight=0.5,
    )  # fmt: skip
    np.testing.assert_allclose(scores, [1.0, 0.25, 0.25])


def test_diversity_penalty_decreases_with_distance() -> None:
    refs = np.zeros((1, 2))
    cands = np.array([[0.0, 0.0], [0.1, 0.0], [0.3, 0.0], [1.0, 1.0]])
    d = min_distances(cands, refs)
    np.testing.assert_allclose(d, [0.0, 0.1, 0.3, math.sqrt(2)], atol=1e-12)
    p = proximity(d, 0.2)
    assert p[0] == 1.0 and (np.diff(p) < 0).all()
    assert proximity(min_distances(cands, np.zeros((0, 2))), 0.2).max() == 0.0


def test_gate_blocks_low_p_ok_but_explores_with_epsilon() -> None:
    p = np.array([0.05, 0.5, 0.9])
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(feasibility_gate(p, 0.1, rng, epsilon=0.0), [0, 1, 1])
    opened = sum(feasibility_gate(p, 0.1, rng, epsilon=0.3)[0] for _ in range(1000))
    assert 200 < opened < 400


def test_boundary_scores_prefer_uncertain_then_promising() -> None:
    s = boundary_scores(np.array([0.5, 0.5, 0.95, 0.0]), np.array([1.0, 0.0, 1.0, 1.0]))
    assert s[0] > s[1] > s[2] > s[3] == 0.0


def test_greedy_maximin_spreads_out_and_is_seeded() -> None:
    grid = np.array([[x / 10, y / 10] for x in range(11) for y in range(11)])
    picks = greedy_maximin(grid, 4, np.random.default_rng(0), existing=np.array([[0.0, 0.0]]))
    assert tuple(grid[picks[0]]) == (1.0, 1.0)  # the farthest from the existing point
    chosen = np.vstack([[0.0, 0.0], grid[picks]])
    gaps = [np.linalg.norm(a - b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    assert len(set(picks.tolist())) == 4 and min(gaps) >= 0.5
    again = greedy_maximin(grid, 4, np.random.default_rng(0), existing=np.array([[0.0, 0.0]]))
    np.testing.assert_array_equal(picks, again)


def test_greedy_maxpro_covers_every_parameters_values_where_maximin_takes_corners() -> None:
    """Five picks on a 5 x 5 x 5 x 5 grid: MaxPro's projections onto each parameter hit at
    least four of its five values (a Latin-hypercube-like spread), maximin's mostly the two
    ends; both are seeded and never pick an existing row again."""
    levels = np.linspace(0.0, 1.0, 5)
    grid = np.stack(np.meshgrid(*[levels] * 4, indexing="ij"), axis=-1).reshape(-1, 4)
    existing = grid[[0]]
    maxpro = greedy_maxpro(grid, 5, np.random.default_rng(3), existing=existing)
    maximin = greedy_maximin(grid, 5, np.random.default_rng(3), existing=existing)
    design = np.vstack([existing, grid[maxpro]])
    assert all(len(set(design[:, col])) >= 4 for col in range(4))
    ends = np.isin(grid[maximin], [0.0, 1.0]).mean()
    interior = np.isin(grid[maxpro], [0.25, 0.5, 0.75]).mean()
    assert ends > 0.8 and interior > 0.4
    assert 0 not in maxpro.tolist() and len(set(maxpro.tolist())) == 5
    np.testing.assert_array_equal(
        maxpro, greedy_maxpro(grid, 5, np.random.default_rng(3), existing=existing)
    )


def test_greedy_maxpro_ignores_a_constant_column_and_starts_at_random() -> None:
    points = np.column_stack([np.linspace(0, 1, 9), np.zeros(9)])
    first = {int(greedy_maxpro(points, 1, np.random.default_rng(s))[0]) for s in range(8)}
    assert len(first) > 1  # nothing chosen yet: a random row
    picks = greedy_maxpro(points, 3, np.random.default_rng(0), existing=points[[4]])
    assert {0.0, 1.0} <= set(points[picks, 0].tolist()) and 4 not in picks.tolist()


def test_alignment_features_say_which_power_of_two_divides_each_value() -> None:
    raw = np.array([
        [16.0, 1.0, 0.5, 8.0],
        [48.0, 3.0, 0.25, 16.0],
        [96.0, 4.0, 1.0, 32.0],
        [256.0, 2.0, 2.0, 64.0],
    ])  # fmt: skip
    # mixed powers of two and other integers: columns 0 and 1; floats and all-pow2 are not
    assert alignment_columns(raw) == [0, 1]
    features = alignment_features(raw, [0, 1])
    assert features[:, 0].tolist() == [4.0, 4.0, 5.0, 8.0]  # 48 = 16 * 3, 96 = 32 * 3
    assert features[:, 1].tolist() == [0.0, 0.0, 2.0, 1.0]
    assert features[:, 2].tolist() == [1.0, 0.0, 0.0, 1.0]  # is a power of two
    assert features[:, 3].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert alignment_features(raw, []).shape == (4, 0)
    assert alignment_columns(np.array([[0.0], [3.0], [4.0]])) == []  # not all positive
