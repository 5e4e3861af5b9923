"""The search space: ordered parameter values, known constraints, enumeration and encoding.

A space is the cartesian product of each parameter's value list, cut down by constraints:
expressions over parameter names and problem sizes (constants bound in every evaluation), parsed by
:mod:`surrotune.expressions` and never ``eval``-ed. Everything here works in *index space*: a
configuration is a row of positions into the value lists, so enumeration, sampling, lookups and the
model encoding are NumPy operations over integer arrays rather than Python loops over
configurations.

Enumeration is a progressive cross join with constraint push-down. Constraints are split into their
top-level ``and`` terms; terms over a single parameter shrink that parameter's value list before
any join; the other parameters are joined one at a time, in an order chosen so that terms become
evaluable early, and each term filters the table as soon as all of its names are bound. A 10^7
product with selective constraints therefore never exists in memory. Parameters that appear in no
constraint are joined last, since they only multiply rows. The result is sorted back into
lexicographic order of value positions (parameter order), so it is deterministic.

Exception tree (under :class:`surrotune.errors.SurrotuneError` and ``ValueError``)::

    SpaceError           an invalid space, constraint or configuration
     └── SpaceTooLarge   enumeration would exceed ``max_enumerate`` rows; use ``sample()``
"""

from __future__ import annotations

import ast
import functools
import keyword
import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from surrotune.errors import SurrotuneError
from surrotune.expressions import Expression, ExpressionError
from surrotune.result import ParamValue

if TYPE_CHECKING:
    from surrotune.backends.replay import Dataset

__all__ = [
    "ENCODING_VERSION",
    "ParamValue",
    "RecordedSpace",
    "SearchSpace",
    "SpaceError",
    "SpaceTooLarge",
]

#: Version of :meth:`SearchSpace.encode`. Bump it whenever the encoding changes, so that a saved
#: model trained on the old encoding is refused instead of silently mis-reading its inputs.
ENCODING_VERSION = 1

#: products up to this size are sampled without replacement (a random permutation of the whole
#: product), so that ``sample`` can return *every* feasible configuration of a small space.
_PERMUTE_LIMIT = 1 << 23
#: the largest batch ``sample`` draws at once, to bound its memory
_MAX_BATCH = 1 << 20


class SpaceError(SurrotuneError, ValueError):
    """An invalid search space, constraint or configuration (the message says which and why)."""


class SpaceTooLarge(SpaceError):
    """Enumeration would build a table larger than ``max_enumerate`` rows; use ``sample()``."""


class _Term:
    """One ``and``-term of a constraint, with the parameters it reads (sizes excluded)."""

    __slots__ = ("expr", "params")

    def __init__(self, expr: Expression, params: frozenset[str]) -> None:
        self.expr = expr
        self.params = params


class SearchSpace:
    """Ordered parameters with value lists, constrained by expressions over them and sizes.

    Args:
        parameters: ordered ``name -> ordered distinct values`` (ints, floats, strs, bools). The
            order of names is the column order everywhere; the order of values defines the value
            positions (indices) used for enumeration order, neighbours and string encodings.
        constraints: expression texts (or parsed :class:`Expression` objects) that a feasible
            configuration makes true (non-zero). They may use parameter names, size names and the
            functions of :mod:`surrotune.expressions`. Integer division or modulo by zero gives 0
            (NumPy semantics) rather than an error.
        sizes: problem sizes and other constants, bound by name in every evaluation.
        max_enumerate: the most rows any table built by :meth:`enumerate` may have; beyond it
            :class:`SpaceTooLarge` is raised and callers use :meth:`sample`.

    Raises:
        SpaceError: an empty or duplicated value list, a bad name, a constraint that does not
            parse or uses a name that is neither a parameter nor a size.

    The object is immutable; :meth:`enumerate` caches its result on first use.
    """

    def __init__(
        self,
        parameters: Mapping[str, Sequence[ParamValue]],
        constraints: Sequence[str | Expression] = (),
        sizes: Mapping[str, int | float] | None = None,
        *,
        max_enumerate: int = 20_000_000,
    ) -> None:
        if not parameters:
            raise SpaceError("a search space needs at least one parameter; got none")
        if isinstance(constraints, (str, Expression)):
            constraints = (constraints,)
        self._names = tuple(parameters)
        self._values = {name: _check_values(name, parameters[name]) for name in self._names}
        for name in self._names:
            _check_name(name, "parameter")
        self._sizes = dict(_check_sizes(sizes or {}, self._names))
        self._constraints = tuple(self._parse(c) for c in constraints)
        if max_enumerate < 1:
            raise SpaceError(f"max_enumerate must be a positive integer; got {max_enumerate!r}")
        self._max_enumerate = int(max_enumerate)

        self._arrays = {name: _value_array(vals) for name, vals in self._values.items()}
        self._lengths = np.array([len(self._values[n]) for n in self._names], dtype=np.int64)
        self._positions = {
            n: {v: i for i, v in enumerate(vals)} for n, vals in self._values.items()
        }
        self._sorted = {n: _sorted_lookup(self._arrays[n]) for n in self._names}
        self._codes = {n: _encode_values(self._values[n]) for n in self._names}
        self._terms, self._domains = self._push_down()
        self._frame: pd.DataFrame | None = None
        self._too_large: SpaceTooLarge | None = None

    # ----------------------------------------------------------------------------------- basics

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in order."""
        return self._names

    @property
    def values(self) -> Mapping[str, tuple[ParamValue, ...]]:
        """Read-only ``name -> value tuple``, in order."""
        return MappingProxyType(self._values)

    @property
    def constraints(self) -> tuple[Expression, ...]:
        """The parsed constraints, as given."""
        return self._constraints

    @property
    def sizes(self) -> Mapping[str, int | float]:
        """Read-only problem sizes bound in every constraint evaluation."""
        return MappingProxyType(self._sizes)

    @property
    def max_enumerate(self) -> int:
        """The row limit of :meth:`enumerate`'s tables."""
        return self._max_enumerate

    @property
    def product_size(self) -> int:
        """Size of the unconstrained cartesian product (a Python int; may be huge)."""
        return math.prod(len(v) for v in self._values.values())

    def __repr__(self) -> str:
        params = ", ".join(f"{n}[{len(v)}]" for n, v in self._values.items())
        return (
            f"{type(self).__name__}({params}; {len(self._constraints)} constraint(s), "
            f"product {self.product_size})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SearchSpace):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((tuple(self._values.items()), tuple(c.text for c in self._constraints)))

    # ----------------------------------------------------------------------------- enumeration

    def enumerate(self) -> pd.DataFrame:
        """All feasible configurations, one row each, in lexicographic order of value positions.

        Columns follow :attr:`names`; a column's dtype is that of its value list: int64, float64
        (floats, or ints mixed with floats), bool, pandas' string dtype for strings, object for
        other mixtures. The table is computed once and cached; each
        call returns a shallow copy, so callers cannot alter the cache.

        Raises:
            SpaceTooLarge: some intermediate table (or the result) would exceed
                ``max_enumerate`` rows, even with constraint push-down.
        """
        if self._frame is None:
            if self._too_large is not None:  # known from an earlier attempt: do not rebuild
                raise SpaceTooLarge(str(self._too_large))
            try:
                index = self._enumerate_indices()
            except SpaceTooLarge as exc:
                self._too_large = exc
                raise
            self._frame = self._frame_from_indices(index)
        return self._frame.copy(deep=False)

    @property
    def enumerable(self) -> bool:
        """Whether :meth:`enumerate` succeeds (tries it, and caches the outcome, if unsure)."""
        if self._frame is not None:
            return True
        try:
            self.enumerate()
        except SpaceTooLarge:
            return False
        return True

    def __len__(self) -> int:
        """The number of feasible configurations (enumerates)."""
        return len(self.enumerate())

    def _enumerate_indices(self) -> np.ndarray:
        """Feasible rows as an ``(n, d)`` matrix of value positions, lexicographically sorted."""
        d = len(self._names)
        if any(len(dom) == 0 for dom in self._domains.values()):
            return np.zeros((0, d), dtype=np.int64)
        limit = self._max_enumerate
        order = self._join_order()
        small = _index_dtype(int(self._lengths.max()))
        cols: dict[str, np.ndarray] = {}
        rows = 1
        pending = list(self._terms)
        for name in order:
            dom = self._domains[name].astype(small)
            if rows * len(dom) > limit:
                raise self._too_large_error(rows * len(dom), [*cols, name])
            cols = {k: np.repeat(v, len(dom)) for k, v in cols.items()}
            cols[name] = np.tile(dom, rows)
            rows *= len(dom)
            ready = [t for t in pending if t.params <= cols.keys()]
            pending = [t for t in pending if t not in ready]
            for term in ready:
                keep = self._truth(term.expr, self._env(cols, term.params), rows)
                if not keep.all():
                    cols = {k: v[keep] for k, v in cols.items()}
                    rows = int(keep.sum())
        if order != self._names and rows > 1:
            perm = self._lex_order([cols[name] for name in self._names])
            cols = {k: v[perm] for k, v in cols.items()}
        index = np.empty((d, rows), dtype=np.int64)  # filled by rows: each column is contiguous
        for k, name in enumerate(self._names):
            index[k] = cols[name]
        return index.T

    def _join_order(self) -> tuple[str, ...]:
        """Join order: greedily complete terms early; unconstrained parameters last.

        At each step the parameter that completes the most pending terms is joined; ties go to the
        one closest to completing some term, then to the smaller (already filtered) value list,
        then to declaration order. Deterministic, so enumeration is reproducible.
        """
        constrained = {p for t in self._terms for p in t.params}
        bound: set[str] = set()
        order: list[str] = []
        pending = [t.params for t in self._terms]

        def score(name: str) -> tuple[int, int, int, int]:
            with_name = bound | {name}
            completes = sum(p <= with_name for p in pending)
            closest = min((len(p - with_name) for p in pending if name in p), default=0)
            return (-completes, closest, len(self._domains[name]), self._names.index(name))

        while len(bound) < len(constrained):
            candidates = [n for n in self._names if n in constrained and n not in bound]
            best = min(candidates, key=score)
            bound.add(best)
            order.append(best)
            pending = [p for p in pending if not p <= bound]
        order += [n for n in self._names if n not in constrained]
        return tuple(order)

    def _lex_order(self, columns: list[np.ndarray]) -> np.ndarray:
        """Permutation that sorts rows of positions lexicographically in parameter order."""
        if self.product_size >= 2**62:
            return np.lexsort(columns[::-1])
        rank = np.zeros(len(columns[0]), dtype=np.int64)
        for column, stride in zip(columns, _strides(self._lengths), strict=True):
            rank += column.astype(np.int64) * stride
        return np.argsort(rank)

    def _too_large_error(self, rows: int, bound: list[str]) -> SpaceTooLarge:
        return SpaceTooLarge(
            f"enumerating this space needs a table of {rows:,} rows after joining "
            f"{', '.join(bound)} (cartesian product {self.product_size:,}), more than "
            f"max_enumerate={self._max_enumerate:,}; use sample() instead, or raise max_enumerate"
        )

    # -------------------------------------------------------------------------------- sampling

    def sample(self, n: int, rng: np.random.Generator, *, max_tries: int = 50) -> pd.DataFrame:
        """Up to ``n`` distinct feasible configurations, uniformly at random.

        Batches are drawn uniformly from the product (of the value lists left after single-
        parameter constraints) and filtered by the other constraints; this is the way to pick
        configurations from spaces too large to :meth:`enumerate`, and it never enumerates.
        Rows come in draw order, in the same columns and dtypes as :meth:`enumerate`.

        Contract on the number of rows: exactly ``n`` when the space has at least ``n`` feasible
        configurations and they are found within ``max_tries`` batches. Products of up to 2^23
        configurations are drawn *without* replacement and the batches are sized to cover the
        whole product within ``max_tries``, so there a shorter result means the space has only
        that many feasible configurations, and all of them are returned. For larger products a
        shorter result means the constraints are too selective for rejection sampling within
        ``max_tries`` batches.
        """
        if n < 0:
            raise SpaceError(f"sample() needs n >= 0; got {n}")
        if max_tries < 1:
            raise SpaceError(f"sample() needs max_tries >= 1; got {max_tries}")
        d = len(self._names)
        empty = np.zeros((0, d), dtype=np.int64)
        doms = [self._domains[name] for name in self._names]
        if n == 0 or any(len(dom) == 0 for dom in doms):
            return self._frame_from_indices(empty)
        sizes = np.array([len(dom) for dom in doms], dtype=np.int64)
        reduced = math.prod(int(s) for s in sizes)
        found: list[np.ndarray] = []
        count = 0
        if reduced <= _PERMUTE_LIMIT:
            perm = rng.permutation(reduced)
            batch = max(-(-reduced // max_tries), min(4 * n, reduced), 1)
            for start in range(0, reduced, batch):
                local = _unravel(perm[start : start + batch], sizes)
                local = local[self._feasible_rows(local, doms)][: n - count]
                found.append(np.stack([dom[local[:, k]] for k, dom in enumerate(doms)], 1))
                count += len(found[-1])
                if count >= n:
                    break
        else:
            seen = pd.Index([])
            rate = 1.0
            for _ in range(max_tries):
                want = n - count
                batch = int(min(_MAX_BATCH, max(256, 2 * want / max(rate, 1e-6))))
                local = np.stack([rng.integers(0, s, size=batch) for s in sizes], axis=1)
                local = local[self._feasible_rows(local, doms)]
                keys = pd.Index(_row_keys(local, sizes))
                fresh = np.flatnonzero(~keys.duplicated() & ~keys.isin(seen))[:want]
                rate = max(len(local) / batch, 1.0 / _MAX_BATCH)
                seen = seen.append(keys[fresh])
                found.append(np.stack([dom[local[fresh, k]] for k, dom in enumerate(doms)], 1))
                count += len(fresh)
                if count >= n:
                    break
        index = np.concatenate(found) if found else empty
        return self._frame_from_indices(index)

    def _feasible_rows(self, local: np.ndarray, doms: list[np.ndarray]) -> np.ndarray:
        """Mask of rows (positions in the reduced domains ``doms``) that satisfy every term."""
        keep = np.ones(len(local), dtype=bool)
        if len(local) == 0:
            return keep
        cols = {
            name: dom[local[:, k]]
            for k, (name, dom) in enumerate(zip(self._names, doms, strict=True))
        }
        for term in self._terms:
            keep &= self._truth(term.expr, self._env(cols, term.params), len(local))
        return keep

    # ------------------------------------------------------------------------ feasibility, keys

    def is_feasible(self, config: Mapping[str, ParamValue]) -> bool:
        """Whether ``config`` satisfies every constraint; False for a value not in its list."""
        return not self.violated(config)

    def feasible_mask(self, frame: pd.DataFrame) -> np.ndarray:
        """Vectorised :meth:`is_feasible` over the rows of ``frame``; extra columns are ignored."""
        index, known = self._lookup(frame)
        n = len(index)
        index = np.where(known[:, None], index, 0)
        cols = {name: index[:, k] for k, name in enumerate(self._names)}
        keep = known.copy()
        for expr in self._constraints:
            keep &= self._truth(expr, self._env(cols, self._params_of(expr)), n)
        return keep

    def violated(self, config: Mapping[str, ParamValue]) -> list[str]:
        """Texts of the constraints ``config`` breaks, in order, for messages and statuses.

        A value that is not in its parameter's list is reported first as ``"name in (v1, v2,
        ...)"``; constraints reading such a parameter are then not evaluated.
        """
        positions = self._positions_of(config)
        broken = [
            f"{name} in {self._values[name]!r}"
            for name, pos in zip(self._names, positions, strict=True)
            if pos < 0
        ]
        unknown = {name for name, pos in zip(self._names, positions, strict=True) if pos < 0}
        cols = {
            name: np.array([max(pos, 0)]) for name, pos in zip(self._names, positions, strict=True)
        }
        for expr in self._constraints:
            params = self._params_of(expr)
            if params & unknown:
                continue
            if not self._truth(expr, self._env(cols, params), 1)[0]:
                broken.append(expr.text)
        return broken

    def key(self, config: Mapping[str, ParamValue]) -> str:
        """Kernel Tuner's cache key: values in parameter order joined by ``","``.

        Each value prints as the list's own value (so ``16.0`` for an int list prints ``16``),
        which makes the key stable whatever numeric type the configuration carries.
        """
        positions = self._positions_of(config)
        self._require_known(config, positions)
        return ",".join(
            str(self._values[name][pos]) for name, pos in zip(self._names, positions, strict=True)
        )

    def keys(self, frame: pd.DataFrame) -> list[str]:
        """:meth:`key` for every row of ``frame``, by array operations per column."""
        index = self.index_of(frame)
        if len(index) == 0:
            return []
        parts = []
        for k, name in enumerate(self._names):
            texts = np.array([str(v) for v in self._values[name]], dtype=object)
            parts.append(texts[index[:, k]])
        joined = functools.reduce(lambda a, b: a + "," + b, parts)
        return list(joined)

    def index_of(
        self, frame: pd.DataFrame | Mapping[str, ParamValue] | Iterable[Mapping[str, ParamValue]]
    ) -> np.ndarray:
        """Value positions, an ``(n, d)`` int64 matrix in parameter order (for distances).

        Raises:
            SpaceError: a column is missing or holds a value that is not in its list.
        """
        frame = _as_frame(frame, self._names)
        index, known = self._lookup(frame)
        if not known.all():
            row = int(np.argmin(known))
            bad = [n for k, n in enumerate(self._names) if index[row, k] < 0]
            raise SpaceError(
                f"row {row} has {bad[0]}={frame[bad[0]].iloc[row]!r}, which is not one of "
                f"{self._values[bad[0]]!r}"
            )
        return index

    # ------------------------------------------------------------------------------- encoding

    def encode(
        self, frame_or_configs: pd.DataFrame | Mapping[str, ParamValue] | Iterable[Mapping]
    ) -> np.ndarray:
        """The models' numeric encoding: a float64 ``(n, d)`` matrix in ``[0, 1]``.

        One column per parameter, in :attr:`names` order, computed from the value lists alone
        (a pure function of the space; :data:`ENCODING_VERSION` names this scheme):

        * numeric parameters (int, float, bool): the value itself, or ``log2(value)`` when all
          values are positive and their spacing is geometric (more uniform in log2 than linearly,
          as for powers of two; at least three values), then min-max scaled over the value list;
        * other parameters (strings, mixed lists): position / (n - 1);
        * a parameter with a single value encodes as 0.

        The encoding is monotone in the value for numeric parameters and in the position for the
        others.

        Raises:
            SpaceError: a configuration has a value that is not in its parameter's list.
        """
        frame = _as_frame(frame_or_configs, self._names)
        index = self.index_of(frame)
        out = np.empty(index.shape, dtype=np.float64)
        for k, name in enumerate(self._names):
            out[:, k] = self._codes[name][index[:, k]]
        return out

    # ------------------------------------------------------------------------------ neighbours

    def neighbours(self, config: Mapping[str, ParamValue]) -> list[dict[str, ParamValue]]:
        """Feasible configurations one value step from ``config`` in exactly one parameter.

        For each parameter in order, the previous then the next value in its list; used by the
        sampler to explore along the boundary of the feasible region.
        """
        positions = self._positions_of(config)
        self._require_known(config, positions)
        base = {
            name: self._values[name][pos] for name, pos in zip(self._names, positions, strict=True)
        }
        out: list[dict[str, ParamValue]] = []
        for name, pos in zip(self._names, positions, strict=True):
            for step in (pos - 1, pos + 1):
                if 0 <= step < len(self._values[name]):
                    candidate = {**base, name: self._values[name][step]}
                    if self.is_feasible(candidate):
                        out.append(candidate)
        return out

    # ----------------------------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (e.g. for a study's system attributes).

        Parameters are stored as ``[name, values]`` pairs so that their order survives stores
        that do not keep the key order of JSON objects.
        """
        return {
            "parameters": [[name, list(vals)] for name, vals in self._values.items()],
            "constraints": [c.text for c in self._constraints],
            "sizes": dict(self._sizes),
            "encoding_version": ENCODING_VERSION,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, max_enumerate: int = 20_000_000) -> SearchSpace:
        """Rebuild a space from :meth:`to_dict` output (parameters may also be a mapping)."""
        try:
            params = data["parameters"]
        except KeyError:
            raise SpaceError(
                f"a stored search space needs a 'parameters' entry; got keys {sorted(data)}"
            ) from None
        pairs = params.items() if isinstance(params, Mapping) else params
        return cls(
            {str(name): list(vals) for name, vals in pairs},
            list(data.get("constraints", ())),
            dict(data.get("sizes") or {}),
            max_enumerate=max_enumerate,
        )

    # -------------------------------------------------------------------------------- internals

    def _parse(self, constraint: str | Expression) -> Expression:
        """Parse one constraint and check that every name is a parameter or a size."""
        try:
            expr = (
                constraint if isinstance(constraint, Expression) else Expression.parse(constraint)
            )
        except ExpressionError as exc:
            raise SpaceError(f"constraint {constraint!r} is invalid: {exc}") from None
        unknown = sorted(expr.names - set(self._names) - set(self._sizes))
        if unknown:
            raise SpaceError(
                f"constraint {expr.text!r} uses unknown name(s) {', '.join(unknown)}; "
                f"parameters: {', '.join(self._names)}; "
                f"sizes: {', '.join(self._sizes) or '(none)'}"
            )
        return expr

    def _params_of(self, expr: Expression) -> frozenset[str]:
        return frozenset(expr.names - self._sizes.keys())

    def _push_down(self) -> tuple[tuple[_Term, ...], dict[str, np.ndarray]]:
        """Split constraints into ``and``-terms and apply single-parameter terms to the lists.

        Returns the remaining multi-parameter terms and, per parameter, the value positions that
        pass its single-parameter terms (all positions are empty if a constant term is false).
        """
        domains = {n: np.arange(len(self._values[n]), dtype=np.int64) for n in self._names}
        terms: list[_Term] = []
        for expr in self._constraints:
            for term in _conjuncts(expr):
                params = self._params_of(term)
                if len(params) >= 2:
                    terms.append(_Term(term, params))
                    continue
                if not params:
                    if not self._truth(term, self._sizes, 1)[0]:
                        domains = {n: dom[:0] for n, dom in domains.items()}
                    continue
                (name,) = params
                cols = {name: domains[name]}
                domains[name] = domains[name][
                    self._truth(term, self._env(cols, params), len(domains[name]))
                ]
        return tuple(terms), domains

    def _env(self, cols: Mapping[str, np.ndarray], params: Iterable[str]) -> dict[str, Any]:
        """Bind the named parameters (gathering values at the given positions) and all sizes."""
        env: dict[str, Any] = dict(self._sizes)
        for name in params:
            env[name] = self._arrays[name][cols[name]]
        return env

    @staticmethod
    def _truth(expr: Expression, env: Mapping[str, Any], n: int) -> np.ndarray:
        """Evaluate ``expr`` as a boolean array of length ``n`` (non-zero is true)."""
        try:
            with np.errstate(all="ignore"):
                result = np.asarray(expr.evaluate(env))
        except (ExpressionError, ArithmeticError, TypeError, ValueError) as exc:
            raise SpaceError(f"constraint {expr.text!r} cannot be evaluated: {exc}") from None
        if result.dtype != np.bool_:
            result = result.astype(bool)
        return np.broadcast_to(result, (n,))

    def _lookup(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Value positions of ``frame``'s rows (-1 where unknown) and a per-row all-known mask."""
        missing = [n for n in self._names if n not in frame.columns]
        if missing:
            raise SpaceError(
                f"configurations lack parameter(s) {', '.join(missing)}; "
                f"expected columns {', '.join(self._names)}"
            )
        index = np.empty((len(frame), len(self._names)), dtype=np.int64)
        for k, name in enumerate(self._names):
            index[:, k] = self._column_positions(name, frame[name].to_numpy())
        return index, (index >= 0).all(axis=1)

    def _column_positions(self, name: str, column: np.ndarray) -> np.ndarray:
        """Positions of a column's values in ``name``'s list (-1 where absent)."""
        lookup = self._sorted[name]
        if lookup is not None and column.dtype.kind in "biuf":
            sorted_values, order = lookup
            x = column.astype(np.float64)
            pos = np.searchsorted(sorted_values, x)
            pos = np.minimum(pos, len(sorted_values) - 1)
            hit = sorted_values[pos] == x
            return np.where(hit, order[pos], -1)
        table = self._positions[name]
        return np.fromiter(
            (_get_position(table, v) for v in column.tolist()), dtype=np.int64, count=len(column)
        )

    def _positions_of(self, config: Mapping[str, ParamValue]) -> list[int]:
        missing = [n for n in self._names if n not in config]
        if missing:
            raise SpaceError(
                f"configuration {dict(config)!r} lacks parameter(s) {', '.join(missing)}"
            )
        return [_get_position(self._positions[n], config[n]) for n in self._names]

    def _require_known(self, config: Mapping[str, ParamValue], positions: list[int]) -> None:
        for name, pos in zip(self._names, positions, strict=True):
            if pos < 0:
                raise SpaceError(
                    f"{name}={config[name]!r} is not one of its values {self._values[name]!r}"
                )

    def _frame_from_indices(self, index: np.ndarray) -> pd.DataFrame:
        data = {name: self._arrays[name][index[:, k]] for k, name in enumerate(self._names)}
        return pd.DataFrame(data, columns=list(self._names), copy=False)  # arrays are fresh


class RecordedSpace(SearchSpace):
    """The configurations a recording holds: the space of a replay whose constraints are unknown.

    A brute-force recording (a Kernel Tuner cache, a T4 file) lists every configuration its tuner
    considered feasible, but not always the restrictions that made it so. Here the recorded set
    *is* the feasible set: :meth:`enumerate`, :meth:`sample`, :meth:`is_feasible` and
    :meth:`feasible_mask` answer from it, so no sampler proposes a configuration the replay
    cannot answer. :meth:`violated` names the recording for an unrecorded configuration.
    :meth:`to_dict` adds the recording's path; :meth:`SearchSpace.from_dict` cannot rebuild the
    recorded set from it (it gives the unconstrained :class:`SearchSpace`).
    """

    def __init__(self, dataset: Dataset, *, max_enumerate: int = 20_000_000) -> None:
        super().__init__(dataset.parameters, max_enumerate=max_enumerate)
        if self.product_size >= 2**62:
            raise SpaceError(f"the recording {dataset.path} has a product too large to index")
        self._source = str(dataset.path)
        configs = pd.DataFrame(
            [{n: r.config.get(n) for n in self._names} for r in dataset.results.values()],
            columns=list(self._names),
        )
        index, known = self._lookup(configs)
        self._recorded = np.unique(index[known] @ _strides(self._lengths))

    def _enumerate_indices(self) -> np.ndarray:
        if len(self._recorded) > self._max_enumerate:
            raise self._too_large_error(len(self._recorded), ["the recording"])
        return _unravel(self._recorded, self._lengths)

    def _is_recorded(self, index: np.ndarray) -> np.ndarray:
        return np.isin(index @ _strides(self._lengths), self._recorded)

    def sample(self, n: int, rng: np.random.Generator, *, max_tries: int = 50) -> pd.DataFrame:
        """Up to ``n`` distinct recorded configurations, uniformly at random (all if fewer)."""
        if n < 0:
            raise SpaceError(f"sample() needs n >= 0; got {n}")
        chosen = rng.permutation(len(self._recorded))[:n]
        return self._frame_from_indices(_unravel(self._recorded[chosen], self._lengths))

    def is_feasible(self, config: Mapping[str, ParamValue]) -> bool:
        """Whether ``config`` is in the recording."""
        positions = self._positions_of(config)
        if min(positions) < 0:
            return False
        return bool(self._is_recorded(np.array([positions]))[0])

    def feasible_mask(self, frame: pd.DataFrame) -> np.ndarray:
        """Vectorised :meth:`is_feasible`: which rows of ``frame`` are in the recording."""
        index, known = self._lookup(frame)
        return known & self._is_recorded(np.where(known[:, None], index, 0))

    def violated(self, config: Mapping[str, ParamValue]) -> list[str]:
        """Values outside their lists, or the recording when ``config`` is not in it."""
        broken = super().violated(config)
        if not broken and not self.is_feasible(config):
            broken.append(f"recorded in {self._source}")
        return broken

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "recording": self._source}


# ------------------------------------------------------------------------------------ helpers


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise SpaceError(
            f"{what} name {name!r} cannot be used in expressions; use a Python identifier "
            "such as 'block_size_x'"
        )


def _check_values(name: str, values: Sequence[ParamValue]) -> tuple[ParamValue, ...]:
    """Normalise a value list to plain Python scalars and check it is non-empty and distinct."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise SpaceError(f"parameter {name!r} needs a list of values; got {values!r}")
    out: list[ParamValue] = []
    for v in values:
        if isinstance(v, np.generic):
            v = v.item()
        if not isinstance(v, (bool, int, float, str)):
            raise SpaceError(
                f"parameter {name!r} has the value {v!r} of type {type(v).__name__}; "
                "values must be ints, floats, strings or bools"
            )
        if isinstance(v, float) and not math.isfinite(v):
            raise SpaceError(f"parameter {name!r} has the non-finite value {v!r}")
        out.append(v)
    if not out:
        raise SpaceError(f"parameter {name!r} has no values; give at least one")
    seen: dict[ParamValue, ParamValue] = {}
    for v in out:
        if v in seen:
            raise SpaceError(
                f"parameter {name!r} lists {seen[v]!r} and {v!r}, which are equal; "
                "values must be distinct"
            )
        seen[v] = v
    return tuple(out)


def _check_sizes(sizes: Mapping[str, int | float], params: tuple[str, ...]) -> Mapping[str, Any]:
    out: dict[str, int | float] = {}
    for name, value in sizes.items():
        _check_name(name, "size")
        if name in params:
            raise SpaceError(f"{name!r} is both a parameter and a size; rename one of them")
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpaceError(f"size {name!r} must be a number; got {value!r}")
        out[name] = value
    return out


def _is_numeric(values: Sequence[ParamValue]) -> bool:
    return all(isinstance(v, (bool, int, float)) for v in values)


def _value_array(values: Sequence[ParamValue]) -> np.ndarray:
    """The list as a NumPy array with the dtype its frame column should have."""
    if all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.bool_)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if _is_numeric(values):
        return np.array(values, dtype=np.float64)
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def _sorted_lookup(array: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Sorted float values and their positions, for vectorised lookups of numeric columns."""
    if array.dtype == object:
        return None
    as_float = array.astype(np.float64)
    order = np.argsort(as_float, kind="stable")
    return as_float[order], order


def _get_position(table: Mapping[ParamValue, int], value: Any) -> int:
    if isinstance(value, np.generic):
        value = value.item()
    try:
        return table.get(value, -1)
    except TypeError:  # unhashable
        return -1


def _encode_values(values: Sequence[ParamValue]) -> np.ndarray:
    """Per-position codes in [0, 1] for one parameter (see :meth:`SearchSpace.encode`)."""
    n = len(values)
    if n == 1:
        return np.zeros(1)
    if not _is_numeric(values):
        return np.arange(n, dtype=np.float64) / (n - 1)
    x = np.array(values, dtype=np.float64)
    if _looks_geometric(x):
        x = np.log2(x)
    low, high = x.min(), x.max()
    return (x - low) / (high - low)


def _looks_geometric(x: np.ndarray) -> bool:
    """True when positive values are more evenly spaced in log2 than linearly (e.g. 2^k)."""
    if len(x) < 3 or (x <= 0).any():
        return False
    ordered = np.sort(x)
    linear = np.diff(ordered)
    logarithmic = np.diff(np.log2(ordered))

    def spread(gaps: np.ndarray) -> float:
        return float(gaps.std() / gaps.mean())

    return spread(logarithmic) < spread(linear) - 1e-12


def _conjuncts(expr: Expression) -> list[Expression]:
    """The top-level ``and``-terms of ``expr`` (itself if it is not an ``and``)."""
    body = expr.tree.body
    if not (isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And)):
        return [expr]
    out: list[Expression] = []
    for value in body.values:
        out += _conjuncts(Expression.parse(ast.unparse(value)))
    return out


def _index_dtype(longest: int) -> type[np.integer]:
    """The narrowest integer type for value positions, to keep wide join tables small."""
    if longest <= 1 << 8:
        return np.uint8
    if longest <= 1 << 16:
        return np.uint16
    return np.int64


def _strides(lengths: np.ndarray) -> np.ndarray:
    """Mixed-radix strides: the last parameter varies fastest (lexicographic rank)."""
    strides = np.ones(len(lengths), dtype=np.int64)
    for k in range(len(lengths) - 2, -1, -1):
        strides[k] = strides[k + 1] * lengths[k + 1]
    return strides


def _unravel(flat: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Flat ranks to per-parameter positions (mixed radix, last parameter fastest)."""
    out = np.empty((len(flat), len(sizes)), dtype=np.int64)
    rest = flat.astype(np.int64)
    for k in range(len(sizes) - 1, -1, -1):
        out[:, k] = rest % sizes[k]
        rest = rest // sizes[k]
    return out


def _row_keys(local: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """One hashable key per row: its mixed-radix rank, or its bytes for astronomic products."""
    if math.prod(int(x) for x in sizes) < 2**63:
        return local @ _strides(sizes)
    keys = np.empty(len(local), dtype=object)
    keys[:] = [row.tobytes() for row in np.ascontiguousarray(local)]
    return keys


def _as_frame(
    data: pd.DataFrame | Mapping[str, ParamValue] | Iterable[Mapping[str, ParamValue]],
    names: Sequence[str],
) -> pd.DataFrame:
    """One configuration, several, or a frame, as a frame (an empty one keeps the columns)."""
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, Mapping):
        return pd.DataFrame([dict(data)])
    rows = [dict(row) for row in data]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(names))
