"""Bench metrics against values computed by hand, and random search against full enumeration.

The tiny feasible set used throughout: five configurations, minimised, one failure::

    2.0, failure, 1.0, 4.0, 2.5     (optimum 1.0; best first: 1.0, 2.0, 2.5, 4.0, failure)

Fractions of the optimum, best first: 1, 0.5, 0.4, 0.25, 0.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from surrotune.bench import metrics

FEASIBLE = [2.0, None, 1.0, 4.0, 2.5]


def test_best_so_far_and_fractions_by_hand() -> None:
    run = [None, 4.0, 2.0, 2.5, 1.0]
    best = metrics.best_so_far(run, "minimize")
    assert np.isnan(best[0]) and best[1:].tolist() == [4.0, 2.0, 2.0, 1.0]
    assert metrics.fraction_curve(run, 1.0, "minimize").tolist() == [0.0, 0.25, 0.5, 0.5, 1.0]
    # a run that ended early keeps its last value up to the budget; a longer one is cut
    assert metrics.fraction_curve([None, 4.0], 1.0, "minimize", 4).tolist() == [
        0,
        0.25,
        0.25,
        0.25,
    ]
    assert metrics.fraction_curve(run, 1.0, "minimize", 2).tolist() == [0.0, 0.25]
    assert metrics.fraction_curve([], 1.0, "minimize", 2).tolist() == [0.0, 0.0]


def test_maximised_fraction_is_best_over_optimum() -> None:
    run = [50.0, None, 80.0, 100.0]
    assert metrics.fraction_curve(run, 100.0, "maximize").tolist() == [0.5, 0.5, 0.8, 1.0]
    assert metrics.evaluations_to_reach(run, 100.0, "maximize", 0.8) == 3


def test_evaluations_to_reach_by_hand() -> None:
    run = [None, 4.0, 2.0, 2.5, 1.0]
    assert metrics.evaluations_to_reach(run, 1.0, "minimize", 0.25) == 2
    assert metrics.evaluations_to_reach(run, 1.0, "minimize", 0.5) == 3
    assert metrics.evaluations_to_reach(run, 1.0, "minimize", 0.95) == 5
    assert metrics.evaluations_to_reach(run, 1.0, "minimize", 1.0) == 5
    assert metrics.evaluations_to_reach(run[:4], 1.0, "minimize", 0.98) is None
    # 1/3 of 3.0 comes out a hair under 1/3: still counts as reaching it
    assert metrics.evaluations_to_reach([3.0], 1.0, "minimize", 1 / 3) == 1


def test_rank_probabilities_are_the_order_statistics() -> None:
    # P(best of n draws is the i-th) = C(N - i, n - 1) / C(N, n), N = 5
    p = metrics.random_rank_probabilities(5, 3)
    expected = [
        [math.comb(5 - i, n - 1) / math.comb(5, n) for i in range(1, 6)] for n in (1, 2, 3)
    ]
    np.testing.assert_allclose(p, expected, atol=1e-12)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    # beyond N draws random search has seen everything: the best is the optimum
    np.testing.assert_allclose(metrics.random_rank_probabilities(5, 7)[-1], [1, 0, 0, 0, 0])


def test_random_expectation_by_hand() -> None:
    # n = 1: mean of the fractions; n = 2: weights C(5 - i, 1) / C(5, 2) = (4, 3, 2, 1, 0) / 10
    expected = metrics.random_expected_fraction(FEASIBLE, "minimize", 5)
    assert expected[0] == pytest.approx((1 + 0.5 + 0.4 + 0.25 + 0) / 5)  # 0.43
    assert expected[1] == pytest.approx((4 * 1 + 3 * 0.5 + 2 * 0.4 + 1 * 0.25) / 10)  # 0.655
    assert expected[4] == pytest.approx(1.0)
    best = metrics.random_expected_best(FEASIBLE, "minimize", 2)  # failures count as worst (4.0)
    assert best[0] == pytest.approx((1 + 2 + 2.5 + 4 + 4) / 5)  # 2.7
    assert best[1] == pytest.approx((4 * 1 + 3 * 2 + 2 * 2.5 + 1 * 4) / 10)  # 1.9


def _enumerate_random_search(
    feasible: list[float | None], direction: metrics.Direction
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean fraction curve, mean best curve and P(reached 50 %) over every draw order."""
    optimum = metrics.optimum_of(feasible, direction)
    worst = max(v for v in feasible if v is not None)
    if direction == "maximize":
        worst = min(v for v in feasible if v is not None)
    fractions, bests, reached = [], [], []
    for order in itertools.permutations(feasible):
        fractions.append(metrics.fraction_curve(list(order), optimum, direction))
        best = metrics.best_so_far(list(order), direction)
        bests.append(np.where(np.isnan(best), worst, best))
        reached.append(fractions[-1] >= 0.5)
    return np.mean(fractions, axis=0), np.mean(bests, axis=0), np.mean(reached, axis=0)


@pytest.mark.parametrize(
    ("feasible", "direction"),
    [
        (FEASIBLE, "minimize"),
        ([3.0, None, 3.0, 1.5, None, 6.0], "minimize"),  # ties and two failures
        ([10.0, None, 40.0, 20.0, 25.0], "maximize"),
    ],
)
def test_random_expectation_matches_enumeration_of_all_orders(
    feasible: list[float | None], direction: metrics.Direction
) -> None:
    fraction, best, reached = _enumerate_random_search(feasible, direction)
    n = len(feasible)
    np.testing.assert_allclose(
        metrics.random_expected_fraction(feasible, direction, n), fraction, atol=1e-12
    )
    np.testing.assert_allclose(
        metrics.random_expected_best(feasible, direction, n), best, atol=1e-12
    )
    np.testing.assert_allclose(
        metrics.random_reach_probability(feasible, direction, 0.5, n), reached, atol=1e-12
    )


def test_random_expected_evaluations_to_reach() -> None:
    # K good of N: (N + 1) / (K + 1)
    assert metrics.random_expected_evaluations_to_reach(FEASIBLE, "minimize", 1.0) == 3.0
    assert metrics.random_expected_evaluations_to_reach(FEASIBLE, "minimize", 0.5) == 2.0
    # against enumeration: the mean first position of a good configuration
    firsts = [
        next(i + 1 for i, v in enumerate(order) if v is not None and 1.0 / v >= 0.4)
        for order in itertools.permutations(FEASIBLE)
    ]
    assert metrics.random_expected_evaluations_to_reach(FEASIBLE, "minimize", 0.4) == (
        pytest.approx(np.mean(firsts))
    )


def test_random_median_evaluations_to_reach() -> None:
    # P(reached 100 % after n) = 1 - C(4, n) / C(5, n) = 0.2, 0.4, 0.6, ...: the median is 3
    assert metrics.random_median_evaluations_to_reach(FEASIBLE, "minimize", 1.0) == 3
    # P(reached 40 %) = 1 - C(2, n) / C(5, n) = 0.6 after one draw
    assert metrics.random_median_evaluations_to_reach(FEASIBLE, "minimize", 0.4) == 1
    firsts = [
        next(i + 1 for i, v in enumerate(order) if v is not None and 1.0 / v >= 0.5)
        for order in itertools.permutations(FEASIBLE)
    ]  # K = 2 of 5: P(first after 1) = 0.4, after 2 = 0.7
    assert metrics.random_median_evaluations_to_reach(FEASIBLE, "minimize", 0.5) == (
        int(np.percentile(firsts, 50, method="inverted_cdf"))
    )


def test_random_expectation_is_exact_on_a_large_space() -> None:
    # log-space binomials: no overflow for N = 10,000, and each row is a distribution
    rng = np.random.default_rng(0)
    feasible: list[float | None] = list(rng.uniform(1, 10, 10_000))
    feasible[:100] = [None] * 100
    p = metrics.random_rank_probabilities(len(feasible), 200)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    curve = metrics.random_expected_fraction(feasible, "minimize", 200)
    assert np.all(np.diff(curve) > 0) and 0 < curve[0] < curve[-1] < 1


def test_methodology_score_by_hand() -> None:
    # baseline r = 2.7, 1.9, 1.45, 1.2 (expected best of random search, failures as worst 4.0)
    np.testing.assert_allclose(
        metrics.random_expected_best(FEASIBLE, "minimize", 4), [2.7, 1.9, 1.45, 1.2]
    )
    # the optimum at once scores 1 at every point
    assert metrics.methodology_score([1.0], FEASIBLE, "minimize", 4) == pytest.approx(1.0)
    # a failure, then 4.0, then 2.0: (f - r) / (1 - r) = 1.3/-1.7, 2.1/-0.9, 0.55/-0.45, 0.8/-0.2
    curve = metrics.methodology_score_curve([None, 4.0, 2.0], FEASIBLE, "minimize", 4)
    np.testing.assert_allclose(curve, [-1.3 / 1.7, -2.1 / 0.9, -0.55 / 0.45, -4.0])
    assert metrics.methodology_score([None, 4.0, 2.0], FEASIBLE, "minimize", 4) == (
        pytest.approx(np.mean([-1.3 / 1.7, -2.1 / 0.9, -0.55 / 0.45, -4.0]))
    )
    # once random search is certain to hold the optimum nobody can beat it: 0 there
    assert metrics.methodology_score_curve([1.0], FEASIBLE, "minimize", 5)[-1] == 0.0


def test_mean_score_over_all_orders_of_random_search_is_zero() -> None:
    # the baseline is exactly random search's expectation, so random search scores 0 on average
    scores = [
        metrics.methodology_score(list(order), FEASIBLE, "minimize", 4)
        for order in itertools.permutations(FEASIBLE)
    ]
    assert np.mean(scores) == pytest.approx(0.0, abs=1e-12)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="direction"):
        metrics.best_so_far([1.0], "fastest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no configuration has a value"):
        metrics.optimum_of([None, None], "minimize")
    with pytest.raises(ValueError, match="baseline must have 3 points"):
        metrics.methodology_score([1.0], FEASIBLE, "minimize", 3, baseline=np.zeros(2))


# ----------------------------------------------------------------- the median's interval


def test_median_interval_by_hand() -> None:
    # n = 20: P(B <= 5) = 0.0207 <= 0.025 < P(B <= 6) = 0.0577, so [x_(6), x_(15)]
    counts = [3, 1, 20, 7, 5, 9, 11, 2, 14, 4, 18, 6, 16, 8, 12, 10, 13, 15, 17, 19]
    assert metrics.median_interval(counts) == (6.0, 15.0)
    # n = 6: P(B <= 0) = 1/64 <= 0.025 < P(B <= 1) = 7/64: the extremes
    assert metrics.median_interval([4, 2, 6, 1, 5, 3]) == (1.0, 6.0)
    # n = 5: P(B <= 0) = 1/32 > 0.025: no 95 % interval exists
    assert metrics.median_interval([1, 2, 3, 4, 5]) is None
    # at 50 % confidence n = 5 gives one: P(B <= 1) = 6/32 <= 0.25 < P(B <= 2) = 1/2
    assert metrics.median_interval([5, 4, 3, 2, 1], confidence=0.5) == (2.0, 4.0)


def test_median_interval_counts_never_as_beyond_every_count() -> None:
    counts = [None, 4, None, 2, None, 9, None, 1, None, None, 7, 3]  # n = 12: [x_(3), x_(10)]
    assert metrics.median_interval(counts) == (3.0, None)
    assert metrics.median_interval([None] * 8) == (None, None)


def test_median_interval_covers_the_median_as_often_as_it_says() -> None:
    """Exact coverage for a continuous distribution is 1 - 2 P(B <= k - 1) >= 0.95; checked
    on 4,000 samples of 20 draws from a heavy-tailed distribution."""
    rng = np.random.default_rng(0)
    samples = rng.lognormal(3.0, 1.0, size=(4000, 20))
    true_median = np.exp(3.0)
    inside = [low <= true_median <= high for low, high in map(metrics.median_interval, samples)]
    assert 0.945 <= np.mean(inside) <= 0.975  # 1 - 2 * 0.0207 = 0.9586


def test_median_interval_rejects_a_confidence_outside_0_1() -> None:
    with pytest.raises(ValueError, match="confidence"):
        metrics.median_interval([1, 2, 3], confidence=1.0)


def test_median_ratio_interval_by_construction() -> None:
    # constant sides: every resample has the same ratio
    assert metrics.median_ratio_interval([20] * 7, [10] * 5, never=201) == (2.0, 2.0)
    # "never" counts as the given value
    assert metrics.median_ratio_interval([None] * 4, [50] * 4, never=201) == (4.02, 4.02)
    # the same sample on both sides: the interval holds 1, and is the same for a seed
    sample = [3, 9, 14, 20, 27, 31, 44, 58, 90, 120]
    low, high = metrics.median_ratio_interval(sample, sample, never=201)
    assert low < 1.0 < high
    assert metrics.median_ratio_interval(sample, sample, never=201) == (low, high)
    assert metrics.median_ratio_interval([], sample, never=201) is None
    with pytest.raises(ValueError, match="confidence"):
        metrics.median_ratio_interval(sample, sample, never=201, confidence=0.0)


def test_median_ratio_interval_holds_the_true_ratio_as_often_as_it_says() -> None:
    """Two lognormal samples of 20 whose medians differ by 2×: the 95 % interval holds 2 in
    roughly 95 % of 300 repetitions (a percentile bootstrap undercovers a little at n = 20)."""
    rng = np.random.default_rng(1)
    inside = 0
    for k in range(300):
        cold = rng.lognormal(np.log(40.0), 0.8, 20)
        warm = rng.lognormal(np.log(20.0), 0.8, 20)
        low, high = metrics.median_ratio_interval(cold, warm, never=1e9, resamples=500, seed=k)
        inside += low <= 2.0 <= high
    assert 0.88 <= inside / 300 <= 0.99
