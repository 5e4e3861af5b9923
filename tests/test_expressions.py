"""Expressions: arithmetic, comparisons and booleans work on scalars and arrays; nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from surrotune.expressions import Expression, ExpressionError


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a * b + 1", {"a": 3, "b": 4}, 13),
        ("a // b", {"a": 7, "b": 2}, 3),
        ("a % 32 != 0", {"a": 48}, True),
        ("1 < a <= 4", {"a": 4}, True),
        ("1 < a <= 4", {"a": 5}, False),
        ("not (a == 1 or b == 2)", {"a": 0, "b": 2}, False),
        ("cdiv(n, b)", {"n": 100, "b": 32}, 4),
        ("max(a, b) - min(a, b)", {"a": 3, "b": 10}, 7),
        ("a if a > b else b", {"a": 1, "b": 2}, 2),
        ("2 ** a", {"a": 10}, 1024),
        ("-a + +b", {"a": 1, "b": 2}, 1),
    ],
)
def test_scalar_evaluation(text: str, env: dict[str, int], expected: object) -> None:
    assert Expression.parse(text).evaluate(env) == expected


def test_vectorised_evaluation_matches_scalar() -> None:
    expr = Expression.parse("use_padding == 0 or bx % 32 != 0 and by * bx <= 1024")
    bx = np.array([16, 32, 64, 48, 1024])
    by = np.array([1, 2, 32, 4, 2])
    pad = np.array([1, 1, 0, 1, 1])
    vector = expr.evaluate({"bx": bx, "by": by, "use_padding": pad})
    scalar = [
        bool(expr.evaluate({"bx": int(x), "by": int(y), "use_padding": int(p)}))
        for x, y, p in zip(bx, by, pad, strict=True)
    ]
    assert vector.tolist() == scalar == [True, False, True, True, False]


def test_names_exclude_functions() -> None:
    assert Expression.parse("cdiv(N, BLOCK) * min(A, 2)").names == {"N", "BLOCK", "A"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("__import__('os')", "calls"),
        ("open('f')", "calls"),
        ("a.b", "attribute"),
        ("a[0]", "indexing"),
        ("'x'", "literal"),
        ("lambda: 1", "lambda"),
        ("[1, 2]", "List"),
        ("(y := 2)", "assignment"),
        ("min(a, key=b)", "keyword"),
        ("a +", "not a valid expression"),
    ],
)
def test_forbidden_constructs(text: str, fragment: str) -> None:
    with pytest.raises(ExpressionError, match=fragment):
        Expression.parse(text)


def test_unknown_names_are_reported() -> None:
    with pytest.raises(ExpressionError, match=r"unknown name.*Z"):
        Expression.parse("X * Z", known=["X", "Y"])


def test_evaluate_int_refuses_fractions() -> None:
    assert Expression.parse("n / 2").evaluate_int({"n": 8}) == 4
    with pytest.raises(ExpressionError, match="whole number"):
        Expression.parse("n / 3").evaluate_int({"n": 8})


def test_missing_value_at_evaluation() -> None:
    with pytest.raises(ExpressionError, match="needs a value for b"):
        Expression.parse("a + b").evaluate({"a": 1})
