"""Diversity: how close candidates are to what was tried, and a space-filling initial design.

Distances are Euclidean in the encoded space (:meth:`SearchSpace.encode`, every parameter in
[0, 1]), so one step of a 16-value parameter weighs less than the flip of a binary flag.
"""

from __future__ import annotations

import numpy as np

__all__ = ["greedy_maximin", "greedy_maxpro", "min_distances", "proximity"]


def min_distances(candidates: np.ndarray, references: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """For each candidate row, the distance to its nearest reference row (inf if none)."""
    out = np.full(len(candidates), np.inf)
    if len(references) == 0 or len(candidates) == 0:
        return out
    refs = np.asarray(references, dtype=np.float64)
    ref_sq = (refs**2).sum(axis=1)
    for start in range(0, len(candidates), chunk):
        block = np.asarray(candidates[start : start + chunk], dtype=np.float64)
        sq = (block**2).sum(axis=1)[:, None] + ref_sq[None, :] - 2.0 * block @ refs.T
        out[start : start + chunk] = np.sqrt(np.maximum(sq.min(axis=1), 0.0))
    return out


def proximity(distances: np.ndarray, length_scale: float) -> np.ndarray:
    """A penalty in [0, 1] that decreases with distance: ``exp(-(d / length_scale)^2)``.

    1 at a reference itself, about 0.37 one length scale away, 0 with no reference (inf).
    """
    if length_scale <= 0:
        raise ValueError(f"length_scale must be positive; got {length_scale}")
    d = np.asarray(distances, dtype=np.float64)
    return np.exp(-((d / length_scale) ** 2))


#: rows a maximin pick searches by default: the whole of most kernel spaces, a bounded cost on
#: larger ones
MAXIMIN_POOL = 2048


def greedy_maximin(
    points: np.ndarray,
    n: int,
    rng: np.random.Generator,
    *,
    existing: np.ndarray | None = None,
    pool: int = MAXIMIN_POOL,
) -> np.ndarray:
    """Indices of ``n`` rows of ``points`` that spread out: each the farthest from those before.

    A random subset of at most ``pool`` rows is searched (seeded, so the design is reproducible
    and its cost bounded on large spaces). Distances count from ``existing`` rows too, so a
    design continued after some trials fills the gaps they left. Without ``existing``, the first
    pick is a random row.
    """
    if n <= 0 or len(points) == 0:
        return np.zeros(0, dtype=np.int64)
    subset = rng.permutation(len(points))[: min(pool, len(points))]
    cand = np.asarray(points[subset], dtype=np.float64)
    dist = (
        min_distances(cand, existing)
        if existing is not None and len(existing)
        else np.full(len(cand), np.inf)
    )
    chosen: list[int] = []
    for _ in range(min(n, len(cand))):
        pick = int(rng.integers(len(cand))) if np.isinf(dist).all() else int(np.argmax(dist))
        chosen.append(pick)
        dist = np.minimum(dist, np.sqrt(((cand - cand[pick]) ** 2).sum(axis=1)))
        dist[pick] = -1.0
    return subset[np.array(chosen, dtype=np.int64)]


def _maxpro_offsets(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The columns that vary over ``points`` and, for each, a quarter of its smallest step
    squared: the offset that keeps a shared value's term finite in the MaxPro criterion."""
    varying, offsets = [], []
    for col in range(points.shape[1]):
        values = np.unique(points[:, col])
        if len(values) > 1:
            varying.append(col)
            offsets.append((np.diff(values).min() / 2.0) ** 2)
    return np.array(varying, dtype=np.int64), np.array(offsets, dtype=np.float64)


def greedy_maxpro(
    points: np.ndarray,
    n: int,
    rng: np.random.Generator,
    *,
    existing: np.ndarray | None = None,
    pool: int = MAXIMIN_POOL,
) -> np.ndarray:
    """Indices of ``n`` rows of ``points`` chosen greedily by the maximum projection criterion.

    Maximin spreads points in the full space, which in a kernel's space means its corners (every
    parameter at an end value), and says nothing about how the points project onto the few
    parameters that matter. MaxPro (Joseph, Gul and Ba, "Maximum projection designs for
    computer experiments", Biometrika 2015) picks the row that minimises
    ``sum_j 1 / prod_l ((x_l - x_jl)^2 + delta_l)`` over the rows ``j`` chosen before: a shared
    value of any one parameter makes the product small, so every subset of parameters is
    covered evenly, interior values included. ``delta_l`` (a quarter of the parameter's
    smallest step, squared) is the discrete version's offset that keeps a shared value finite.
    The pool, the seeding and ``existing`` work as in :func:`greedy_maximin`; without
    ``existing`` the first pick is a random row.
    """
    if n <= 0 or len(points) == 0:
        return np.zeros(0, dtype=np.int64)
    subset = rng.permutation(len(points))[: min(pool, len(points))]
    cols, offsets = _maxpro_offsets(np.asarray(points, dtype=np.float64))
    cand = np.asarray(points[subset], dtype=np.float64)[:, cols]

    def log_terms(reference: np.ndarray) -> np.ndarray:
        return -np.log((cand - reference) ** 2 + offsets).sum(axis=1)

    log_psi = np.full(len(cand), -np.inf)
    for row in np.asarray(existing if existing is not None else [], dtype=np.float64).reshape(
        -1, points.shape[1]
    ):
        log_psi = np.logaddexp(log_psi, log_terms(row[cols]))
    chosen: list[int] = []
    for _ in range(min(n, len(cand))):
        if np.isneginf(log_psi).all():
            pick = int(rng.integers(len(cand)))
        else:
            pick = int(np.argmin(log_psi))
        chosen.append(pick)
        log_psi = np.logaddexp(log_psi, log_terms(cand[pick]))
        log_psi[pick] = np.inf
    return subset[np.array(chosen, dtype=np.int64)]
