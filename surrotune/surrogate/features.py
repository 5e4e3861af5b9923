"""Feature encoding for the surrogate models: a pure, versioned function of configurations.

The models see, per configuration, the :meth:`SearchSpace.encode` columns (each parameter in
[0, 1], log-scaled where the values are geometric) plus *derived* columns: for every pair of
positive numeric parameters, the log2 of their product and of their ratio. Kernel performance and
failures hinge on such combinations (threads per block = bx * by, work per thread = tile_x *
tile_y, shared memory ~ block * tile), and an axis-aligned tree cannot express a product of two
inputs without many splits; one extra column makes it a single split. They cost little: XGBoost
handles a hundred columns on a few hundred rows in milliseconds. For every integer parameter that
mixes powers of two with other values (block widths 16, 32, 48 ...), two more columns say which
power of two divides the value and whether it is one (:func:`alignment_features`): alignment
decides GPU performance in ways magnitude does not show.

Compile-time resources (registers, shared bytes, spills) are *not* features: they are known only
after a configuration was compiled, never for the candidates the sampler scores, and a model
trained on a column it cannot see at prediction time is wrong exactly where it matters. A user
who knows how to compute such quantities from the parameters passes ``derive(frame) ->
DataFrame``; its numeric columns are appended. What the sampler does learn from them is a
regressor of each resource on these features (:mod:`surrotune.surrogate.resources`), whose
prediction against the device's limit multiplies P(ok): a function of the configuration, so
the same for the training rows and the candidates. Its predictions, and the theoretical
occupancy they give, can be performance-model columns too (``SurrogateSampler(
resource_features=True)``, off: on the H200 recordings they drew the search to the resource
limits, docs/BENCHMARKS.md, "Predicted resources and occupancy as features").

Bump :data:`FEATURES_VERSION` whenever the columns or their order change, so that a saved model
trained on the old features is refused rather than misread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from surrotune.space import SearchSpace

__all__ = [
    "FEATURES_VERSION",
    "DeriveFn",
    "DistributionEncoder",
    "alignment_columns",
    "alignment_features",
    "make_features",
    "pairwise_features",
    "raw_values",
]

#: version of the feature columns built by :func:`make_features`
FEATURES_VERSION = 1

#: a user hook: extra numeric columns computed from a frame of configurations
DeriveFn = Callable[[pd.DataFrame], pd.DataFrame]


def raw_values(space: SearchSpace, index: np.ndarray) -> np.ndarray:
    """The parameter values at value positions ``index`` as floats; NaN for non-numeric ones."""
    out = np.full(index.shape, np.nan, dtype=np.float64)
    for k, name in enumerate(space.names):
        values = space.values[name]
        if all(isinstance(v, (bool, int, float)) for v in values):
            out[:, k] = np.asarray(values, dtype=np.float64)[index[:, k]]
    return out


def pairwise_features(raw: np.ndarray, columns: Sequence[int] | None = None) -> np.ndarray:
    """log2(a * b) and log2(a / b) for every pair of the given (positive) raw columns.

    ``columns`` defaults to :func:`positive_columns` of ``raw``; pass the same columns for the
    training rows and the candidates (they are chosen from the *space*, not from a sample).
    """
    if columns is None:
        columns = positive_columns(raw)
    cols = list(columns)
    if len(cols) < 2:
        return np.zeros((len(raw), 0))
    logs = np.log2(raw[:, cols])
    i, j = np.triu_indices(len(cols), k=1)
    return np.concatenate([logs[:, i] + logs[:, j], logs[:, i] - logs[:, j]], axis=1)


def positive_columns(raw: np.ndarray) -> list[int]:
    """Columns whose values are all finite and positive and not all equal (log-able, useful)."""
    out = []
    for k in range(raw.shape[1]):
        col = raw[:, k]
        if len(col) and np.isfinite(col).all() and (col > 0).all() and np.ptp(col) > 0:
            out.append(k)
    return out


def alignment_columns(raw: np.ndarray) -> list[int]:
    """Columns of positive integers that mix powers of two with other values (16, 32, 48 ...):
    the ones where alignment is information the value's magnitude does not carry."""
    out = []
    for k in range(raw.shape[1]):
        col = raw[:, k]
        if not (len(col) and np.isfinite(col).all() and (col > 0).all()):
            continue
        if not np.array_equal(col, np.round(col)):
            continue
        ints = col.astype(np.int64)
        pow2 = (ints & (ints - 1)) == 0
        if pow2.any() and not pow2.all():
            out.append(k)
    return out


def alignment_features(raw: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """Per column: the power of two that divides the value (log2 of its lowest set bit: 48 is
    16-aligned, 4) and whether the value is itself a power of two.

    Why: GPU kernels care about alignment in ways a value's magnitude does not show (a
    power-of-two block divides the power-of-two problem sizes, keeps accesses on 128-byte
    lines, fills whole warps and wavefronts); on Kernel Tuner's convolution spaces for AMD GPUs
    only the power-of-two block widths (16, 32, 64, 128, 256) reach 61 % (W7800) or even 10 %
    (MI250X) of the optimum's performance. An axis-aligned tree on the width alone needs a
    split per value.
    """
    cols = list(columns)
    if not cols:
        return np.zeros((len(raw), 0))
    ints = raw[:, cols].astype(np.int64)
    lowest = ints & -ints
    return np.concatenate(
        [np.log2(lowest).astype(np.float64), (lowest == ints).astype(np.float64)], axis=1
    )


def make_features(
    encoded: np.ndarray,
    raw: np.ndarray,
    *,
    pair_columns: Sequence[int] = (),
    extra: np.ndarray | None = None,
    alignment_columns: Sequence[int] = (),
) -> np.ndarray:
    """The model matrix (float32): encoded parameters, pairwise products/ratios, extras,
    alignment.

    Args:
        encoded: ``(n, d)`` encoding in [0, 1] (:meth:`SearchSpace.encode`).
        raw: ``(n, d)`` raw numeric values (:func:`raw_values`), NaN where non-numeric.
        pair_columns: the raw columns to combine pairwise (empty: no derived columns).
        extra: ``(n, e)`` user-derived columns, appended as given.
        alignment_columns: the raw columns whose :func:`alignment_features` come last.
    """
    parts = [encoded]
    if len(pair_columns) >= 2:
        parts.append(pairwise_features(raw, pair_columns))
    if extra is not None and extra.shape[1]:
        parts.append(extra)
    if len(alignment_columns):
        parts.append(alignment_features(raw, alignment_columns))
    return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)


def derive_columns(derive: DeriveFn | None, frame: pd.DataFrame) -> np.ndarray | None:
    """Apply the user's ``derive`` hook and keep its numeric columns, as floats."""
    if derive is None:
        return None
    extra = derive(frame.reset_index(drop=True))
    if not isinstance(extra, pd.DataFrame) or len(extra) != len(frame):
        raise ValueError(
            f"derive(frame) must return a DataFrame with one row per configuration "
            f"({len(frame)}); got {type(extra).__name__} of length {len(extra)}"
        )
    numeric = extra.select_dtypes(include=["number", "bool"])
    return numeric.to_numpy(dtype=np.float64)


class DistributionEncoder:
    """Encoding, random pools and mutations for a search space given as Optuna distributions.

    This is the plain-Optuna path: no :class:`SearchSpace`, just the distributions seen in the
    study's trials. Floats and ints map to [0, 1] on their (log) scale, categoricals to
    position / (n - 1); raw values feed the pairwise features where they are positive numbers.
    """

    def __init__(self, distributions: Mapping[str, BaseDistribution]) -> None:
        self.names = tuple(sorted(distributions))
        self.distributions = {n: distributions[n] for n in self.names}

    def encode(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """``(encoded, raw)`` matrices of the configurations, columns in :attr:`names` order."""
        n, d = len(configs), len(self.names)
        encoded = np.zeros((n, d))
        raw = np.full((n, d), np.nan)
        for k, name in enumerate(self.names):
            dist = self.distributions[name]
            if isinstance(dist, CategoricalDistribution):
                pos = np.array([dist.to_internal_repr(c[name]) for c in configs], dtype=float)
                encoded[:, k] = pos / max(len(dist.choices) - 1, 1)
                if all(isinstance(v, (bool, int, float)) for v in dist.choices):
                    values = np.array(dist.choices, dtype=float)
                    raw[:, k] = values[pos.astype(np.int64)]
                continue
            assert isinstance(dist, (FloatDistribution, IntDistribution))
            x = np.array([float(c[name]) for c in configs])
            raw[:, k] = x
            low, high = float(dist.low), float(dist.high)
            if dist.log:
                x, low, high = np.log(x), math.log(low), math.log(high)
            encoded[:, k] = (x - low) / (high - low) if high > low else 0.0
        return encoded, raw

    def key(self, config: Mapping[str, Any]) -> tuple[Any, ...]:
        """A hashable identity of a configuration (internal representations)."""
        return tuple(self.distributions[n].to_internal_repr(config[n]) for n in self.names)

    def sample(self, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        """``n`` configurations drawn independently and uniformly (log-uniformly for log)."""
        columns = {name: self._draw(dist, n, rng) for name, dist in self.distributions.items()}
        return [{name: columns[name][i] for name in self.names} for i in range(n)]

    def mutate(
        self, configs: Sequence[Mapping[str, Any]], n: int, rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        """``n`` local variations of ``configs``: one or two parameters each, moved a little."""
        out = []
        for i in range(n):
            child = dict(configs[i % len(configs)])
            moved = rng.choice(
                len(self.names), size=min(len(self.names), 1 + i % 2), replace=False
            )
            for k in moved:
                name = self.names[int(k)]
                child[name] = self._nudge(self.distributions[name], child[name], rng)
            out.append(child)
        return out

    @staticmethod
    def _draw(dist: BaseDistribution, n: int, rng: np.random.Generator) -> list[Any]:
        if isinstance(dist, CategoricalDistribution):
            return [dist.choices[i] for i in rng.integers(0, len(dist.choices), size=n)]
        assert isinstance(dist, (FloatDistribution, IntDistribution))
        low, high = float(dist.low), float(dist.high)
        if dist.log:
            x = np.exp(rng.uniform(math.log(low), math.log(high), size=n))
        else:
            x = rng.uniform(low, high, size=n)
        return [_snap(dist, v) for v in x]

    @staticmethod
    def _nudge(dist: BaseDistribution, value: Any, rng: np.random.Generator) -> Any:
        if isinstance(dist, CategoricalDistribution):
            pos = dist.to_internal_repr(value) + int(rng.choice((-1, 1)))
            return dist.choices[int(np.clip(pos, 0, len(dist.choices) - 1))]
        assert isinstance(dist, (FloatDistribution, IntDistribution))
        low, high = float(dist.low), float(dist.high)
        if dist.log:
            span = math.log(high) - math.log(low)
            x = math.exp(math.log(float(value)) + rng.normal(0.0, 0.1 * span))
        else:
            x = float(value) + rng.normal(0.0, 0.1 * (high - low))
            if isinstance(dist, IntDistribution) and round(x) == value:
                x = value + int(rng.choice((-1, 1))) * dist.step
        return _snap(dist, min(max(x, low), high))


def _snap(dist: FloatDistribution | IntDistribution, x: float) -> Any:
    """``x`` rounded onto the distribution's grid (step, int) and clipped to its bounds."""
    low, high = dist.low, dist.high
    if isinstance(dist, IntDistribution):
        step = dist.step
        v = low + step * round((x - low) / step)
        while v > high:
            v -= step
        return int(max(v, low))
    if dist.step is not None:
        v = low + dist.step * round((x - low) / dist.step)
        return float(min(max(v, low), high))
    return float(min(max(x, low), high))
