"""Learned failure rules: the failure regions the data implies, as readable conditions.

A shallow decision tree is fitted on the parameters, their pairwise products (so a region such as
``BLOCK_X * BLOCK_Y > 1024`` is one split) and the string parameters one-hot; each leaf whose
majority is a failure status becomes a conjunction of the conditions on its path::

    BLOCK_M * BLOCK_K >= 4096 and DOUBLE_BUFFER == 1 → resource (41/41)

Products with a two-valued factor (a flag) are left out: ``use_shmem == 0 and bx <= 96`` reads
better than ``bx * use_shmem <= 96``. A leaf that falls short of the precision asked for is grown
by up to two more conditions (the splits of best FOIL gain, as a rule learner grows a rule), so a
region of four conditions is found under a depth-3 tree.

Thresholds are printed at the nearest value that occurs in the data (a split at 4.5 between the
values 4 and 8 prints as ``>= 8`` or ``<= 4``), redundant bounds on one feature are merged, and
conditions that do not improve a rule's precision are dropped. Support and precision are counted
on the data, not taken from the tree's (class-weighted) leaf counts.

Besides one multi-class tree over every status, one tree per failure status (that status against
the rest) is fitted, so that a rare status is not drowned by a frequent one; rules covered by a
better rule of the same status are dropped.

:func:`rules_to_attrs` and :func:`rules_from_attrs` turn rules into JSON-ready dicts and back, to
store them in a study's user attributes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["FailureRule", "learn_failure_rules", "rules_from_attrs", "rules_to_attrs"]

_OK = "ok"
_IGNORED = frozenset({"constraint"})
#: the most conditions added to a tree leaf that falls short of the precision asked for
_REFINE_STEPS = 2

#: feature index -> the interval ``(low, high]`` a rule keeps it in
_Bounds = dict[int, tuple[float, float]]


@dataclass(frozen=True)
class FailureRule:
    """A conjunction of conditions on the parameters that predicts one failure status.

    ``support`` counts the trials matching every condition that have ``status``; ``matched``
    counts all trials matching every condition.
    """

    conditions: tuple[str, ...]
    status: str
    support: int
    matched: int

    @property
    def precision(self) -> float:
        return self.support / self.matched if self.matched else 0.0

    def __str__(self) -> str:
        condition = " and ".join(self.conditions) if self.conditions else "always"
        return f"{condition} → {self.status} ({self.support}/{self.matched})"


# ------------------------------------------------------------------------------ features


@dataclass(frozen=True)
class _Feature:
    """One tree input: a numeric parameter, a product of two, or a one-hot string value."""

    name: str  # as printed: ``A``, ``A * B`` or the parameter of a one-hot column
    values: np.ndarray  # the sorted distinct values this feature takes in the data
    category: str | None = None  # the string value of a one-hot column


def _numeric(column: pd.Series) -> np.ndarray | None:
    """The column as floats, or None if any value is not a finite number (then: categorical)."""
    textual = column.dtype == object or pd.api.types.is_string_dtype(column.dtype)
    number = int | float | np.integer | np.floating | bool | np.bool_
    if textual and not all(isinstance(v, number) for v in column):
        return None
    try:
        values = column.to_numpy(dtype=float)
    except (TypeError, ValueError):
        return None
    return values if np.all(np.isfinite(values)) else None


def _features(frame: pd.DataFrame, parameters: Sequence[str]) -> tuple[np.ndarray, list[_Feature]]:
    columns: list[np.ndarray] = []
    features: list[_Feature] = []

    def add(values: np.ndarray, name: str, category: str | None = None) -> None:
        columns.append(values)
        features.append(_Feature(name, np.unique(values), category))

    numeric: list[tuple[str, np.ndarray]] = []
    for name in parameters:
        values = _numeric(frame[name])
        if values is not None:
            if len(np.unique(values)) > 1:
                numeric.append((name, values))
            continue
        labels = frame[name].map(str).to_numpy()
        categories = sorted(set(labels))
        if len(categories) > 1:
            for category in categories:
                add((labels == category).astype(float), name, category)
    for name, values in numeric:
        add(values, name)
    # a product with a two-valued factor (a flag) is a gated condition, clearer as two splits
    multi = [(name, values) for name, values in numeric if len(np.unique(values)) > 2]
    for (name_a, a), (name_b, b) in itertools.combinations(multi, 2):
        product = a * b
        if len(np.unique(product)) > 1:
            add(product, f"{name_a} * {name_b}")
    matrix = np.column_stack(columns) if columns else np.empty((len(frame), 0))
    return matrix, features


# ------------------------------------------------------------------------------ conditions


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _conditions(
    bounds: Mapping[int, tuple[float, float]], features: Sequence[_Feature], order: Sequence[int]
) -> tuple[str, ...]:
    """Readable conditions for ``low < feature <= high`` bounds, in first-split order."""
    out: list[str] = []
    equal_categories = {
        features[i].name for i, (low, _) in bounds.items() if features[i].category and low >= 0.5
    }
    for i in order:
        low, high = bounds[i]
        feature = features[i]
        if feature.category is not None:
            if low >= 0.5:
                out.append(f"{feature.name} == {feature.category!r}")
            elif feature.name not in equal_categories:
                out.append(f"{feature.name} != {feature.category!r}")
            continue
        values = feature.values
        above = values[values > low] if math.isfinite(low) else values
        below = values[values <= high] if math.isfinite(high) else values
        lo = above.min() if math.isfinite(low) and above.size else None
        hi = below.max() if math.isfinite(high) and below.size else None
        # a bound at the extreme value of the feature pins it: ``>= max`` is ``== max``
        if lo is not None and lo == values.max():
            hi = lo
        if hi is not None and hi == values.min():
            lo = hi
        if lo is not None and hi is not None and lo == hi:
            out.append(f"{feature.name} == {_format_number(lo)}")
            continue
        if lo is not None:
            out.append(f"{feature.name} >= {_format_number(lo)}")
        if hi is not None:
            out.append(f"{feature.name} <= {_format_number(hi)}")
    return tuple(out)


def _mask(matrix: np.ndarray, bounds: Mapping[int, tuple[float, float]]) -> np.ndarray:
    mask = np.ones(matrix.shape[0], dtype=bool)
    for i, (low, high) in bounds.items():
        mask &= (matrix[:, i] > low) & (matrix[:, i] <= high)
    return mask


# ------------------------------------------------------------------------------ learning


@dataclass
class _Candidate:
    rule: FailureRule
    mask: np.ndarray


def _leaf_paths(tree: Any) -> Iterable[tuple[int, list[tuple[int, float, bool]]]]:
    """Each leaf with its path: (feature, threshold, went right) from the root down."""
    structure = tree.tree_
    stack: list[tuple[int, list[tuple[int, float, bool]]]] = [(0, [])]
    while stack:
        node, path = stack.pop()
        left, right = structure.children_left[node], structure.children_right[node]
        if left == right:  # a leaf
            yield node, path
            continue
        feature, threshold = int(structure.feature[node]), float(structure.threshold[node])
        stack.append((right, [*path, (feature, threshold, True)]))
        stack.append((left, [*path, (feature, threshold, False)]))


def _bounds(
    path: Sequence[tuple[int, float, bool]],
) -> tuple[_Bounds, list[int]]:
    """The tightest ``(low, high]`` interval per feature along a path, and first-split order."""
    bounds: _Bounds = {}
    order: list[int] = []
    for feature, threshold, right in path:
        low, high = bounds.get(feature, (-math.inf, math.inf))
        if feature not in bounds:
            order.append(feature)
        bounds[feature] = (max(low, threshold), high) if right else (low, min(high, threshold))
    return bounds, order


def _prune(
    bounds: _Bounds,
    order: list[int],
    matrix: np.ndarray,
    target: np.ndarray,
) -> tuple[_Bounds, list[int]]:
    """Drop bounds (last split first) whose removal keeps the precision, growing the support."""

    def precision(b: Mapping[int, tuple[float, float]]) -> float:
        mask = _mask(matrix, b)
        return target[mask].mean() if mask.any() else 0.0

    best = precision(bounds)
    for feature in reversed(list(order)):
        low, high = bounds[feature]
        sides = [(low, math.inf), (-math.inf, high)] if math.isfinite(low + high) else []
        sides.append(None)  # drop the feature altogether
        for side in reversed(sides):
            trial = dict(bounds)
            if side is None:
                del trial[feature]
            else:
                trial[feature] = side
            if trial and precision(trial) >= best - 1e-12:
                bounds = trial
                best = precision(trial)
                if side is None:
                    order = [f for f in order if f != feature]
                break
    return bounds, order


def _refine(
    bounds: _Bounds,
    order: list[int],
    matrix: np.ndarray,
    target: np.ndarray,
    *,
    min_support: int,
    min_precision: float,
    steps: int,
) -> tuple[_Bounds, list[int]]:
    """Add up to ``steps`` conditions, each the split of best FOIL gain, until precise enough.

    A leaf of a shallow tree can hold a failure region together with successes that only one or
    two more conditions would separate (a region of four conditions under a depth-3 tree); this
    grows such a leaf the way a rule learner (FOIL, RIPPER) grows a rule.
    """
    for _ in range(steps):
        mask = _mask(matrix, bounds)
        p0, n0 = int(target[mask].sum()), int((~target[mask]).sum())
        if p0 < min_support or n0 == 0 or p0 / (p0 + n0) >= min_precision:
            break
        base = math.log(p0 / (p0 + n0))
        best: tuple[float, int, float, bool] | None = None
        rows, hits = matrix[mask], target[mask]
        for feature in range(matrix.shape[1]):
            column = rows[:, feature]
            values, inverse = np.unique(column, return_inverse=True)
            if values.size < 2:
                continue
            pos = np.bincount(inverse, weights=hits, minlength=values.size)
            tot = np.bincount(inverse, minlength=values.size).astype(float)
            cum_p, cum_t = np.cumsum(pos)[:-1], np.cumsum(tot)[:-1]
            thresholds = (values[:-1] + values[1:]) / 2
            for right, p, t in (
                (False, cum_p, cum_t),
                (True, p0 - cum_p, (p0 + n0) - cum_t),
            ):
                ok = p >= min_support
                if not ok.any():
                    continue
                gain = np.full(p.shape, -np.inf)
                gain[ok] = p[ok] * (np.log(p[ok] / t[ok]) - base)
                i = int(np.argmax(gain))
                if gain[i] > 1e-9 and (best is None or gain[i] > best[0]):
                    best = (float(gain[i]), feature, float(thresholds[i]), right)
        if best is None:
            break
        _, feature, threshold, right = best
        low, high = bounds.get(feature, (-math.inf, math.inf))
        if feature not in bounds:
            order = [*order, feature]
        bounds = {
            **bounds,
            feature: (max(low, threshold), high) if right else (low, min(high, threshold)),
        }
    return bounds, order


def learn_failure_rules(
    frame: pd.DataFrame,
    parameters: Sequence[str],
    statuses: Sequence[str],
    *,
    min_support: int = 5,
    min_precision: float = 0.9,
    max_depth: int = 3,
    max_rules: int = 10,
) -> list[FailureRule]:
    """The failure regions in ``frame``, as readable rules, best first.

    Args:
        frame: one row per measured configuration; the ``parameters`` columns are used (numbers,
            booleans or strings).
        parameters: the parameter columns.
        statuses: each row's status (``ok``, ``resource``, ...); ``constraint`` rows (never
            measured) are ignored.
        min_support: the fewest trials of its status a rule must match; also the tree's
            ``min_samples_leaf``.
        min_precision: the smallest share of a rule's matched trials that have its status.
        max_depth: the tree depth, so the most conditions a rule has before merging.
        max_rules: the most rules returned.

    Returns:
        Rules sorted by support (descending), then precision; a rule whose matched trials are a
        subset of a better rule's with the same status is left out.
    """
    from sklearn.tree import DecisionTreeClassifier

    statuses = np.asarray([str(s) for s in statuses], dtype=object)
    if len(statuses) != len(frame):
        raise ValueError(f"{len(statuses)} statuses for {len(frame)} rows")
    keep = np.array([s not in _IGNORED for s in statuses], dtype=bool)
    frame, statuses = frame.loc[keep], statuses[keep]
    failures = sorted(set(statuses) - {_OK})
    if not failures or len(frame) == 0 or max_rules <= 0:
        return []
    matrix, features = _features(frame.reset_index(drop=True), parameters)
    if matrix.shape[1] == 0 or len(set(statuses)) < 2:
        return []

    candidates: list[_Candidate] = []
    seen: set[tuple[str, bytes]] = set()
    targets: list[tuple[np.ndarray, Sequence[str] | None]] = [(statuses, None)]
    if len(failures) > 1 or len(set(statuses)) > 2:
        targets += [(np.where(statuses == f, f, "rest"), [f]) for f in failures]
    for labels, only in targets:
        tree = DecisionTreeClassifier(
            class_weight="balanced",
            min_samples_leaf=max(1, int(min_support)),
            max_depth=max_depth,
            random_state=0,
        ).fit(matrix, labels)
        for leaf, path in _leaf_paths(tree):
            status = str(tree.classes_[int(np.argmax(tree.tree_.value[leaf][0]))])
            if status in ("ok", "rest") or (only is not None and status not in only):
                continue
            target = statuses == status
            bounds, order = _bounds(path)
            bounds, order = _refine(
                bounds,
                order,
                matrix,
                target,
                min_support=min_support,
                min_precision=min_precision,
                steps=_REFINE_STEPS,
            )
            bounds, order = _prune(bounds, order, matrix, target)
            mask = _mask(matrix, bounds)
            key = (status, np.packbits(mask).tobytes())
            if key in seen:
                continue
            seen.add(key)
            support, matched = int(target[mask].sum()), int(mask.sum())
            if support < min_support or support / matched < min_precision:
                continue
            rule = FailureRule(_conditions(bounds, features, order), status, support, matched)
            candidates.append(_Candidate(rule, mask))

    candidates.sort(
        key=lambda c: (-c.rule.support, -c.rule.precision, len(c.rule.conditions), str(c.rule))
    )
    kept: list[_Candidate] = []
    for candidate in candidates:
        if any(
            k.rule.status == candidate.rule.status and not np.any(candidate.mask & ~k.mask)
            for k in kept
        ):
            continue
        kept.append(candidate)
        if len(kept) >= max_rules:
            break
    return [c.rule for c in kept]


# ------------------------------------------------------------------------------ storage


def rules_to_attrs(rules: Iterable[FailureRule]) -> list[dict[str, Any]]:
    """JSON-ready dicts, one per rule (for a study's user attributes)."""
    return [
        {
            "conditions": list(rule.conditions),
            "status": rule.status,
            "support": int(rule.support),
            "matched": int(rule.matched),
        }
        for rule in rules
    ]


def rules_from_attrs(attrs: Iterable[Mapping[str, Any]]) -> list[FailureRule]:
    """The rules :func:`rules_to_attrs` stored."""
    return [
        FailureRule(
            conditions=tuple(str(c) for c in item["conditions"]),
            status=str(item["status"]),
            support=int(item["support"]),
            matched=int(item["matched"]),
        )
        for item in attrs
    ]
