"""Failure regions for the report: the run's rule learner, applied until the failures are covered.

:func:`surrotune.surrogate.rules.learn_failure_rules` fits one shallow tree, fast enough to run at
the end of every tuning run. Its best rules cover the largest pure regions; a region whose edge is
a curve (a shared-memory footprint ``(BX * TX + 14) * (BY * TY + 14) > 16384`` is a hyperbola in
the tile extents ``BX * TX`` and ``BY * TY``) needs a staircase of rectangles, and one tree yields
only the first few steps. Offline there is time for the classic remedy, *sequential covering*
(as CN2 and RIPPER do): remove the failures the rules found so far, learn again on what is left
(the ``ok`` rows always stay, as the counter-examples), and keep each new rule that is still
precise on *all* the data. Support and precision are always counted on every measurement.

:func:`rule_mask` evaluates a rule's conditions on a table of configurations (through the
whitelisted :class:`surrotune.expressions.Expression`, never ``eval``), so that a report, a test
or a user can check which configurations a rule covers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from surrotune.expressions import Expression
from surrotune.surrogate.rules import FailureRule, learn_failure_rules

__all__ = ["covered", "learn_rules", "rule_mask"]

_CONDITION = re.compile(r"^(?P<left>.+?)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<right>.+)$")
_IGNORED = frozenset({"constraint"})


def _condition_mask(condition: str, frame: pd.DataFrame) -> np.ndarray:
    match = _CONDITION.match(condition.strip())
    if match is None:
        raise ValueError(f"cannot read the rule condition {condition!r}")
    left, op, right = match["left"].strip(), match["op"], match["right"].strip()
    if right[:1] in ("'", '"'):  # a string parameter: ``NAME == 'value'``
        values = frame[left].map(str).to_numpy()
        text = ast.literal_eval(right)
        return np.asarray(values == text if op == "==" else values != text, dtype=bool)
    if left in frame.columns:
        values = frame[left].to_numpy(dtype=float)
        expression = Expression.parse(f"x {op} {right}")
        return np.asarray(expression.evaluate({"x": values}), dtype=bool)
    expression = Expression.parse(f"{left} {op} {right}", known=frame.columns)
    env = {name: frame[name].to_numpy(dtype=float) for name in expression.names}
    return np.asarray(expression.evaluate(env), dtype=bool) & np.ones(len(frame), dtype=bool)


def rule_mask(rule: FailureRule, frame: pd.DataFrame) -> np.ndarray:
    """Which rows of ``frame`` (columns named as the parameters) satisfy every condition."""
    mask = np.ones(len(frame), dtype=bool)
    for condition in rule.conditions:
        mask &= _condition_mask(condition, frame)
    return mask


def covered(rules: Sequence[FailureRule], frame: pd.DataFrame) -> np.ndarray:
    """Rows that at least one rule covers."""
    mask = np.zeros(len(frame), dtype=bool)
    for rule in rules:
        mask |= rule_mask(rule, frame)
    return mask


def learn_rules(
    frame: pd.DataFrame,
    parameters: Sequence[str],
    statuses: Sequence[str],
    *,
    rounds: int = 5,
    min_support: int = 5,
    min_precision: float = 0.9,
    max_depth: int = 3,
    max_rules: int = 12,
) -> list[FailureRule]:
    """Failure rules by sequential covering over the run's rule learner, best first.

    Args:
        frame: one row per measured configuration, the parameters as columns.
        parameters: the parameter columns.
        statuses: each row's status; ``constraint`` rows are ignored.
        rounds: learning rounds; each learns only on the failures not yet covered.
        min_support: the fewest trials of its status a rule must match (and newly cover).
        min_precision: the smallest share of a rule's matched trials that have its status.
        max_depth: depth of each round's trees.
        max_rules: the most rules returned.

    Returns:
        Rules sorted by support (descending), then precision; support and matched counted on
        every row of ``frame``.
    """
    labels = np.asarray([str(s) for s in statuses], dtype=object)
    keep = np.array([s not in _IGNORED for s in labels], dtype=bool)
    frame = frame.loc[keep].reset_index(drop=True)
    labels = labels[keep]
    failing = labels != "ok"
    rules: list[FailureRule] = []
    masks: list[np.ndarray] = []
    done = np.zeros(len(frame), dtype=bool)
    for _ in range(max(1, rounds)):
        rows = ~(done & failing)
        if not (failing & rows).any():
            break
        learned = learn_failure_rules(
            frame.loc[rows],
            parameters,
            list(labels[rows]),
            min_support=min_support,
            min_precision=min_precision,
            max_depth=max_depth,
            max_rules=max_rules,
        )
        added = False
        for rule in learned:
            mask = rule_mask(rule, frame)
            hits = labels[mask] == rule.status
            support, matched = int(hits.sum()), int(mask.sum())
            new = int((mask & ~done & (labels == rule.status)).sum())
            if not matched or support / matched < min_precision or new < min_support:
                continue
            if any(not np.any(mask & ~m) for m in masks):  # inside a rule already kept
                continue
            rules.append(FailureRule(rule.conditions, rule.status, support, matched))
            masks.append(mask)
            done |= mask
            added = True
        if not added:
            break
    order = sorted(
        range(len(rules)),
        key=lambda i: (-rules[i].support, -rules[i].precision, len(rules[i].conditions)),
    )
    return [rules[i] for i in order][:max_rules]
