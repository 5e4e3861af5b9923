"""Acquisition: expected improvement times P(ok), minus a diversity penalty; gate; boundary.

All on the model's scale, where lower is better (see :func:`performance.transform_objective`).
Expected improvement is normalised by its largest value over the candidates before the penalty
is subtracted, so the penalty weights mean the same thing whatever the objective's scale.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

__all__ = [
    "acquisition_scores",
    "boundary_scores",
    "expected_improvement",
    "feasibility_gate",
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
