"""Search-quality metrics of one tuning run against a brute-forced dataset; pure functions.

Conventions shared by every function here:

- A run is the sequence of its *evaluations* in the order they were made: the objective value of
  each, or ``None`` for a failure (compile, resource, launch, runtime, timeout, correctness). A
  failure costs one evaluation and yields no value. Proposals that broke a known constraint or
  repeated a measured configuration are not evaluations and are not in the sequence.
- The *feasible set* of a dataset is every configuration a tuner could have to pay for: the values
  of its ``ok`` configurations plus one ``None`` per failing one.
- Objectives are positive (times in ms, rates in GB/s or GFLOP/s). The *fraction of the optimum*
  of a value is ``optimum / value`` when minimising and ``value / optimum`` when maximising, so it
  is 1 at the optimum and falls towards 0 for worse values; before the first success it is 0.
- Curves are indexed by evaluations: element ``n - 1`` is the state after ``n`` evaluations.

The exact expectation of random search without replacement comes from order statistics. Sort the
``N`` feasible configurations best first, failures last. The best of the first ``n`` uniformly
random draws is the ``i``-th of that order with probability ``C(N - i, n - 1) / C(N, n)`` (the
``i``-th is drawn, and the other ``n - 1`` draws come from the ``N - i`` worse ones); equivalently
it is the ``i``-th or worse with probability ``S(i, n) = C(N - i + 1, n) / C(N, n)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy.special import gammaln

__all__ = [
    "Direction",
    "best_so_far",
    "evaluations_to_reach",
    "fraction_curve",
    "fraction_of_optimum",
    "median_interval",
    "median_ratio_interval",
    "methodology_score",
    "methodology_score_curve",
    "optimum_of",
    "random_expected_best",
    "random_expected_evaluations_to_reach",
    "random_expected_fraction",
    "random_median_evaluations_to_reach",
    "random_rank_probabilities",
    "random_reach_probability",
]

Direction = Literal["minimize", "maximize"]

#: fractions within this of a target count as reaching it (a value equal to the optimum can come
#: out as 0.9999999999999999 after the division)
_EPS = 1e-12


def _check_direction(direction: str) -> None:
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")


def _better(direction: Direction) -> np.ufunc:
    return np.fmin if direction == "minimize" else np.fmax


def optimum_of(values: Sequence[float | None], direction: Direction) -> float:
    """The best value of a feasible set (failures, ``None``, ignored)."""
    _check_direction(direction)
    ok = [v for v in values if v is not None]
    if not ok:
        raise ValueError("no configuration has a value, so there is no optimum")
    return min(ok) if direction == "minimize" else max(ok)


def best_so_far(values: Sequence[float | None], direction: Direction) -> np.ndarray:
    """The best value after each evaluation; NaN until the first success."""
    _check_direction(direction)
    array = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    if array.size == 0:
        return array
    return _better(direction).accumulate(array)


def fraction_of_optimum(
    best: float | np.ndarray, optimum: float, direction: Direction
) -> float | np.ndarray:
    """How close ``best`` is to ``optimum``, in (0, 1]; 0 where ``best`` is NaN (nothing yet)."""
    _check_direction(direction)
    if not optimum > 0:
        raise ValueError(f"fractions of the optimum need a positive optimum, got {optimum!r}")
    best_array = np.asarray(best, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = optimum / best_array if direction == "minimize" else best_array / optimum
    fraction = np.where(np.isnan(best_array), 0.0, fraction)
    return float(fraction) if fraction.ndim == 0 else fraction


def fraction_curve(
    values: Sequence[float | None], optimum: float, direction: Direction, budget: int | None = None
) -> np.ndarray:
    """Fraction of the optimum after 1, 2, ... evaluations.

    With ``budget``, the curve has exactly ``budget`` points: a run that ended earlier (the
    tuner stopped, or the space was exhausted) keeps its last value, since that is what its user
    is left with; a longer run is cut.
    """
    curve = fraction_of_optimum(best_so_far(values, direction), optimum, direction)
    curve = np.atleast_1d(np.asarray(curve, dtype=np.float64))
    if budget is None:
        return curve
    if curve.size >= budget:
        return curve[:budget]
    last = curve[-1] if curve.size else 0.0
    return np.concatenate([curve, np.full(budget - curve.size, last)])


def evaluations_to_reach(
    values: Sequence[float | None], optimum: float, direction: Direction, target: float
) -> int | None:
    """The number of evaluations after which the fraction of the optimum is >= ``target``.

    None when the run never got there.
    """
    curve = fraction_curve(values, optimum, direction)
    hits = np.nonzero(curve >= target - _EPS)[0]
    return int(hits[0]) + 1 if hits.size else None


def median_interval(
    counts: Sequence[float | None], confidence: float = 0.95
) -> tuple[float | None, float | None] | None:
    """A distribution-free confidence interval for the median of ``counts`` over seeds.

    The order-statistic interval ``[x_(k), x_(n - k + 1)]`` with the largest ``k`` for which
    ``P(B <= k - 1) <= (1 - confidence) / 2``, ``B ~ Binomial(n, 1/2)``: it holds the true
    median with probability at least ``confidence`` whatever the distribution (Conover,
    *Practical Nonparametric Statistics*, 3rd ed., section 3.2), which evaluation counts need
    (heavy-tailed, with ties, and "never" for runs that did not get there). ``None`` in
    ``counts`` is such a run, larger than every count: an end that falls on one is None
    (unbounded within the budget). Returns None when ``n`` is too small for any interval at
    that confidence (fewer than 6 runs at 95 %).
    """
    from scipy.stats import binom

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    n = len(counts)
    alpha = (1.0 - confidence) / 2.0
    k = 0
    while k + 1 <= n and binom.cdf(k, n, 0.5) <= alpha:
        k += 1  # P(B <= k - 1) <= alpha still holds for this k
    if k == 0 or k > n - k + 1:
        return None
    ordered = sorted(counts, key=lambda c: (c is None, c if c is not None else 0.0))
    low, high = ordered[k - 1], ordered[n - k]
    return (None if low is None else float(low)), (None if high is None else float(high))


def median_ratio_interval(
    numerator: Sequence[float | None],
    denominator: Sequence[float | None],
    *,
    never: float,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A percentile-bootstrap interval of ``median(numerator) / median(denominator)``.

    The warm start's goal is such a ratio (the cold start's evaluations over the warm start's),
    of two independent sets of seeds; each set is resampled with replacement, ``resamples``
    times (seeded: the same interval every time). ``None`` counts as ``never`` (the budget + 1,
    as the ratio itself counts a run that never got there). None when either side is empty.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    a = np.array([never if v is None else v for v in numerator], dtype=np.float64)
    b = np.array([never if v is None else v for v in denominator], dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        return None
    rng = np.random.default_rng(seed)
    top = np.median(rng.choice(a, size=(resamples, len(a))), axis=1)
    bottom = np.median(rng.choice(b, size=(resamples, len(b))), axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(top / bottom, [alpha, 1.0 - alpha])
    return float(low), float(high)


# ----------------------------------------------------------------- random search, exactly


def _sorted_best_first(feasible: Sequence[float | None], direction: Direction) -> np.ndarray:
    """Values best first, failures (NaN) last."""
    _check_direction(direction)
    ok = np.array([v for v in feasible if v is not None], dtype=np.float64)
    ok = np.sort(ok) if direction == "minimize" else -np.sort(-ok)
    failures = len(feasible) - ok.size
    return np.concatenate([ok, np.full(failures, np.nan)])


def _survival(total: int, budget: int) -> np.ndarray:
    """``S[n - 1, i - 1]``: P(the best of ``n`` draws is the ``i``-th or worse), n = 1..budget.

    ``S(i, n) = C(N - i + 1, n) / C(N, n)``, computed in log space: exact to rounding for any N.
    """
    n = np.arange(1, budget + 1, dtype=np.float64)[:, None]
    i = np.arange(1, total + 1, dtype=np.float64)[None, :]
    available = total - i + 1  # configurations ranked i or worse
    with np.errstate(invalid="ignore"):
        log_s = (
            gammaln(available + 1)
            - gammaln(np.maximum(available - n, 0) + 1)
            - gammaln(total + 1)
            + gammaln(total - n + 1)
        )
    return np.where(available >= n, np.exp(log_s), 0.0)


def random_rank_probabilities(total: int, budget: int) -> np.ndarray:
    """``P[n - 1, i - 1]`` = P(the best of the first ``n`` draws is the ``i``-th best).

    Equals ``C(N - i, n - 1) / C(N, n)`` for ``n <= N``; rows beyond ``N`` repeat row ``N``
    (random search without replacement has then seen everything).
    """
    if total < 1 or budget < 1:
        raise ValueError(f"need at least one configuration and one draw, got {total}, {budget}")
    steps = min(budget, total)
    survival = _survival(total, steps)
    shifted = np.concatenate([survival[:, 1:], np.zeros((steps, 1))], axis=1)
    probabilities = survival - shifted
    if budget > steps:
        probabilities = np.vstack(
            [probabilities, np.repeat(probabilities[-1:], budget - steps, 0)]
        )
    return probabilities


def random_expected_fraction(
    feasible: Sequence[float | None], direction: Direction, budget: int
) -> np.ndarray:
    """Exact expected fraction of the optimum of random search after 1..``budget`` evaluations.

    Draws are uniform without replacement over the feasible set; a failure costs a draw and, when
    every draw so far failed, the fraction is 0.
    """
    order = _sorted_best_first(feasible, direction)
    optimum = order[0]
    fractions = np.nan_to_num(
        np.asarray(fraction_of_optimum(order, optimum, direction), dtype=np.float64)
    )
    return random_rank_probabilities(order.size, budget) @ fractions


def random_expected_best(
    feasible: Sequence[float | None], direction: Direction, budget: int
) -> np.ndarray:
    """Exact expected best value of random search after 1..``budget`` evaluations.

    For the value scale a run must have a value at every step, so a best-so-far of nothing yet
    (every draw failed) counts as the worst ``ok`` value: failures sort as worst, as the
    methodology's distributions do.
    """
    order = _sorted_best_first(feasible, direction)
    worst = np.nanmax(order) if direction == "minimize" else np.nanmin(order)
    return random_rank_probabilities(order.size, budget) @ np.where(np.isnan(order), worst, order)


def random_reach_probability(
    feasible: Sequence[float | None], direction: Direction, target: float, budget: int
) -> np.ndarray:
    """P(random search has reached ``target`` of the optimum) after 1..``budget`` evaluations.

    With ``K`` of the ``N`` feasible configurations good enough, that is
    ``1 - C(N - K, n) / C(N, n)``.
    """
    order = _sorted_best_first(feasible, direction)
    fractions = np.nan_to_num(np.asarray(fraction_of_optimum(order, order[0], direction)))
    good = int(np.count_nonzero(fractions >= target - _EPS))
    total = order.size
    n = np.arange(1, budget + 1)
    log_miss = (
        gammaln(total - good + 1)
        - gammaln(np.maximum(total - good - n, 0) + 1)
        - gammaln(total + 1)
        + gammaln(np.maximum(total - n, 0) + 1)
    )
    miss = np.where(total - good >= n, np.exp(log_miss), 0.0)
    return 1.0 - miss


def random_expected_evaluations_to_reach(
    feasible: Sequence[float | None], direction: Direction, target: float
) -> float:
    """Exact expected evaluations random search needs to reach ``target`` of the optimum.

    With ``K`` of ``N`` feasible configurations good enough, the first good one drawn without
    replacement comes on average at draw ``(N + 1) / (K + 1)``. Unbounded by any budget: compare
    it with the budget to say whether random search is expected to get there in time.
    """
    order = _sorted_best_first(feasible, direction)
    fractions = np.nan_to_num(np.asarray(fraction_of_optimum(order, order[0], direction)))
    good = int(np.count_nonzero(fractions >= target - _EPS))
    return (order.size + 1) / (good + 1)


def random_median_evaluations_to_reach(
    feasible: Sequence[float | None], direction: Direction, target: float
) -> int:
    """Exact median evaluations random search needs to reach ``target`` of the optimum.

    The smallest ``n`` with P(reached after ``n``) >= 1/2: the number to set beside a sampler's
    median over seeds (the mean, :func:`random_expected_evaluations_to_reach`, is pulled up by
    the long tail of unlucky orders).
    """
    total = len(feasible)
    reached = random_reach_probability(feasible, direction, target, total)
    return int(np.argmax(reached >= 0.5 - _EPS)) + 1


# ----------------------------------------------------------------- the methodology score


def methodology_score_curve(
    values: Sequence[float | None],
    feasible: Sequence[float | None],
    direction: Direction,
    budget: int,
    *,
    baseline: np.ndarray | None = None,
) -> np.ndarray:
    """The standardised performance of one run after 1..``budget`` evaluations.

    Willemsen, Schoonhoven, van Werkhoven et al. (FGCS 2024, "A methodology for comparing
    optimisation algorithms for auto-tuning") standardise a best-so-far curve ``f`` against the
    curve ``r`` of random search without replacement and the optimum ``f*`` of the space, point by
    point: ``(f - r) / (f* - r)``. It is 0 where the run is exactly as good as random search is
    expected to be and 1 at the optimum, and negative where it is worse than random search.

    Here ``r`` is the *exact* expectation (:func:`random_expected_best`), not the package's
    ``round(M (N + 1) / (M + 1))``-th order statistic, and failures are draws (they cost an
    evaluation) that sort as the worst value, for the run as for the baseline. A run that ended
    before ``budget`` keeps its last best value. Where random search is certain to hold the optimum
    (``r == f*``, only possible once it has drawn nearly everything) the point is 0: no strategy
    can beat it there.
    """
    order = _sorted_best_first(feasible, direction)
    optimum = order[0]
    worst = np.nanmax(order) if direction == "minimize" else np.nanmin(order)
    best = best_so_far(values, direction)
    if best.size >= budget:
        best = best[:budget]
    else:
        last = best[-1] if best.size else np.nan
        best = np.concatenate([best, np.full(budget - best.size, last)])
    best = np.where(np.isnan(best), worst, best)
    if baseline is None:
        baseline = random_expected_best(feasible, direction, budget)
    elif baseline.shape != (budget,):
        raise ValueError(f"baseline must have {budget} points, has shape {baseline.shape}")
    gap = optimum - baseline
    with np.errstate(divide="ignore", invalid="ignore"):
        score = (best - baseline) / gap
    return np.where(np.abs(gap) <= _EPS * max(abs(optimum), 1.0), 0.0, score)


def methodology_score(
    values: Sequence[float | None],
    feasible: Sequence[float | None],
    direction: Direction,
    budget: int,
    *,
    baseline: np.ndarray | None = None,
) -> float:
    """The methodology score P of one run: its standardised curve averaged over the budget.

    Variant, stated exactly: the time axis is *evaluations* 1..``budget`` (not wall or simulated
    time, and no cut-off where random search reaches a percentile: the budget is the range);
    the baseline is the exact expected best-so-far value of random search without replacement
    over the feasible set, failures included as worst-valued draws (see
    :func:`methodology_score_curve`); the score is the mean of the standardised curve over that
    range. 0 is random search, 1 is the optimum from the first evaluation on.

    Aggregating over seeds by the *mean* of these per-run scores equals the score of the mean
    best-so-far curve, because the standardisation is affine in the curve at every point. (The
    ``autotuning_methodology`` package instead takes the median position in the sorted
    distribution over repeats before standardising.)

    ``baseline`` is :func:`random_expected_best` of the same arguments, when the caller scores many
    runs of one dataset and has it already.
    """
    curve = methodology_score_curve(values, feasible, direction, budget, baseline=baseline)
    return float(np.mean(curve))
