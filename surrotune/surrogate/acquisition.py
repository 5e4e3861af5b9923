"""Acquisition: expected improvement times P(ok), minus a diversity penalty; gate; boundary.

All on the model's scale, where lower is better (see :func:`performance.transform_objective`).
Expected improvement is normalised by its largest value over the candidates before the penalty
is subtracted, so the penalty weights mean the same thing whatever the objective's scale.
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr, ndtr

__all__ = [
    "acquisition_scores",
    "boundary_scores",
    "expected_improvement",
    "feasibility_gate",
    "max_value_entropy",
    "minimum_draws",
    "value_entropy_gain",
]

_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def expected_improvement(
    mean: np.ndarray, std: np.ndarray, best: float, *, xi: float = 0.0
) -> np.ndarray:
    """E[max(best - xi - Y, 0)] for Y ~ N(mean, std^2) (minimisation).

    Where ``std`` is 0 it is the plain improvement ``max(best - xi - mean, 0)``.
    """
    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    gain = best - xi - mean
    safe = np.where(std > 0, std, 1.0)
    z = gain / safe
    ei = gain * ndtr(z) + safe * _INV_SQRT_2PI * np.exp(-0.5 * z * z)
    return np.where(std > 0, np.maximum(ei, 0.0), np.maximum(gain, 0.0))


def ensemble_expected_improvement(
    members: np.ndarray, best: float, *, xi: float = 0.0, smoothing: bool = True
) -> np.ndarray:
    """Expected improvement under the ensemble's own predictive distribution, not a normal
    fitted to it.

    ``members`` is ``(K, n)``, each member's prediction. Without ``smoothing`` it is the
    improvement averaged over the members (their empirical distribution). With it the
    distribution is their kernel density estimate: a normal around each member, of Silverman's
    robust bandwidth ``0.9 * min(std, IQR / 1.34) * K ** -0.2`` per candidate. Where the
    members agree but for one (two camps around a lone measurement that some bootstrap
    resamples hold and others do not), the interquartile range, and with it the bandwidth, is
    small, so the dissenting member widens the tail only around itself, where a normal of the
    members' standard deviation promises improvement that no member predicts.
    """
    members = np.asarray(members, dtype=np.float64)
    if not smoothing:
        return np.maximum(best - xi - members, 0.0).mean(axis=0)
    q75, q25 = np.percentile(members, [75, 25], axis=0)
    spread = np.minimum(members.std(axis=0), (q75 - q25) / 1.34)
    bandwidth = 0.9 * spread * len(members) ** -0.2
    return expected_improvement(members, bandwidth, best, xi=xi).mean(axis=0)


def minimum_draws(
    mean: np.ndarray,
    std: np.ndarray,
    best: float,
    rng: np.random.Generator,
    samples: int,
    *,
    grid: int = 64,
) -> np.ndarray:
    """``samples`` draws (ascending) of the smallest value over the candidates, none above
    ``best``: the candidates taken as independent normals, P(min > z) = prod_i Phi((mean_i -
    z) / std_i), each draw that distribution's inverse at a uniform quantile.

    Wang and Jegelka fit a Gumbel to this distribution; its exact inverse is as cheap on a
    grid: a coarse grid of ``grid`` points from the lowest plausible value to ``best``
    brackets the draws, a second one over the bracket places them by interpolation (each
    draw's probability within 1e-3 of its quantile: tests/surrogate/test_models.py).
    Candidates 8 deviations above the bracket add log Phi(8) ~ 0 and are left out, so the cost
    follows the contenders, not the space."""
    mean = np.asarray(mean, dtype=np.float64)
    std = np.maximum(np.asarray(std, dtype=np.float64), 1e-12)
    target = np.log1p(-np.sort(rng.random(samples)))  # log P(min > draw), descending
    low, high = float(np.min(mean - 10.0 * std)), float(min(best, np.max(mean)))
    for _ in range(2):
        z = np.linspace(low, high, grid)
        near = (mean - high) / std < 8.0
        log_survival = log_ndtr((mean[near][None, :] - z[:, None]) / std[near][None, :]).sum(1)
        upper = np.searchsorted(-log_survival, -target.min(), side="right")
        lower = np.searchsorted(-log_survival, -target.max(), side="left") - 1
        low, high = float(z[max(lower, 0)]), float(z[min(upper, grid - 1)])
    return np.minimum(np.interp(-target, -log_survival, z), best)


def value_entropy_gain(mean: np.ndarray, std: np.ndarray, y_star: np.ndarray) -> np.ndarray:
    """Max-value entropy search's gain per candidate for minimisation, averaged over draws
    ``y_star`` of the minimum: ``g phi(g) / (2 Phi(g)) - log Phi(g)``, ``g = (mean - y*) /
    std``; 0 where ``std`` is 0 (a measurement there teaches nothing)."""
    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    safe = np.where(std > 0, std, 1.0)
    g = (mean[None, :] - np.asarray(y_star, dtype=np.float64)[:, None]) / safe[None, :]
    log_cdf = log_ndtr(g)
    ratio = _INV_SQRT_2PI * np.exp(-0.5 * g * g - log_cdf)  # phi(g) / Phi(g)
    gain = (0.5 * g * ratio - log_cdf).mean(axis=0)
    return np.where(std > 0, np.maximum(gain, 0.0), 0.0)


def max_value_entropy(
    mean: np.ndarray,
    std: np.ndarray,
    best: float,
    rng: np.random.Generator,
    *,
    samples: int = 16,
) -> np.ndarray:
    """Max-value entropy search (Wang and Jegelka, ICML 2017), for minimisation: the expected
    drop in the entropy of the optimum's *value* from measuring each candidate, over
    ``samples`` draws of the minimum (:func:`minimum_draws`). Where the draws lie far below
    the best, a wide candidate with a poor mean is worth more than under expected improvement,
    which asks only how much that one measurement gains."""
    return value_entropy_gain(mean, std, minimum_draws(mean, std, best, rng, samples))


def acquisition_scores(
    ei: np.ndarray,
    p_ok: np.ndarray,
    penalty: np.ndarray,
    *,
    weight: float,
) -> np.ndarray:
    """``EI / max(EI) * P(ok) - weight * penalty``; higher is better.

    When EI vanishes everywhere (the model expects no improvement anywhere), the predicted
    ranking still matters, so callers pass a tie-breaker inside ``ei`` (see the sampler).
    """
    top = float(np.max(ei)) if len(ei) else 0.0
    scaled = ei / top if top > 0 else np.zeros_like(ei)
    return scaled * p_ok - weight * penalty


def feasibility_gate(
    p_ok: np.ndarray, threshold: float, rng: np.random.Generator, *, epsilon: float
) -> np.ndarray:
    """Which candidates may be proposed: P(ok) >= threshold, or everyone with probability
    ``epsilon`` (the exploration allowance that lets a wrong gate be corrected)."""
    if epsilon > 0 and rng.random() < epsilon:
        return np.ones(len(p_ok), dtype=bool)
    return np.asarray(p_ok) >= threshold


def boundary_scores(p_ok: np.ndarray, promise: np.ndarray) -> np.ndarray:
    """Score for boundary exploration: uncertainty of P(ok) (1 at 0.5, 0 at 0 or 1), weighted
    by ``promise`` in [0, 1] (e.g. normalised EI) so uncertain *and* promising comes first."""
    p = np.asarray(p_ok, dtype=np.float64)
    return (1.0 - np.abs(2.0 * p - 1.0)) * (0.5 + 0.5 * np.asarray(promise, dtype=np.float64))
