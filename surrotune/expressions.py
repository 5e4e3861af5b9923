"""Safe arithmetic expressions over parameters and problem sizes.

Constraints, argument shapes, grid and block sizes, shared-memory sizes and objective formulas are
written as Python-syntax expressions in the experiment file. They are parsed once into an AST,
checked against a whitelist (arithmetic, comparison and boolean operators, numbers, known names and
a handful of pure functions) and evaluated by walking that tree: never by ``eval``. Evaluation is
vectorised: a name may be bound to a NumPy array, so one call filters a whole search space.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FUNCTIONS", "Expression", "ExpressionError"]


class ExpressionError(ValueError):
    """An expression that does not parse, uses a forbidden construct or an unknown name."""


def _cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


#: functions an expression may call; all are elementwise and work on scalars and arrays
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": np.minimum,
    "max": np.maximum,
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "cdiv": _cdiv,
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: np.logical_not,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _describe(node: ast.AST) -> str:
    names = {
        ast.Call: "a call",
        ast.Attribute: "attribute access",
        ast.Subscript: "indexing",
        ast.Lambda: "a lambda",
        ast.NamedExpr: "an assignment",
    }
    return names.get(type(node), type(node).__name__)


@dataclass(frozen=True)
class Expression:
    """A parsed, whitelisted expression.

    Build with :meth:`parse`; ``names`` are the free variables it reads.
    """

    text: str
    tree: ast.Expression
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str | int | float, known: Iterable[str] | None = None) -> Expression:
        """Parse ``text``; with ``known``, every name it uses must be among them.

        Raises :class:`ExpressionError` with a message that says what is wrong.
        """
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ExpressionError(f"expected an expression (a string or a number), got {text!r}")
        source = str(text)
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"{source!r} is not a valid expression: {exc.msg}") from None
        names: set[str] = set()
        for node in ast.walk(tree):
            cls._check_node(node, source)
            if isinstance(node, ast.Name) and not cls._is_function_name(tree, node):
                names.add(node.id)
        if known is not None:
            unknown = sorted(names - set(known))
            if unknown:
                raise ExpressionError(
                    f"{source!r} uses unknown name(s) {', '.join(unknown)}; "
                    f"known: {', '.join(sorted(known)) or '(none)'}"
                )
        return cls(source, tree, frozenset(names))

    @staticmethod
    def _is_function_name(tree: ast.Expression, name: ast.Name) -> bool:
        return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))

    @staticmethod
    def _check_node(node: ast.AST, source: str) -> None:
        allowed = (
            ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name,
            ast.Load, ast.Constant, ast.IfExp, ast.Call, ast.And, ast.Or,
            *_BINARY, *_UNARY, *_COMPARE,
        )  # fmt: skip
        if not isinstance(node, allowed):
            raise ExpressionError(
                f"{source!r} uses {_describe(node)}; only numbers, names, arithmetic "
                "(+ - * / // % **), comparisons, and/or/not, 'x if c else y' and the functions "
                f"{', '.join(FUNCTIONS)} are allowed"
            )
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise ExpressionError(f"{source!r} contains the literal {node.value!r}; only numbers")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExpressionError(
                    f"{source!r} calls {ast.unparse(node.func)}; only {', '.join(FUNCTIONS)}"
                )
            if node.keywords:
                raise ExpressionError(f"{source!r}: keyword arguments are not allowed")

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with names bound from ``env`` (scalars or NumPy arrays)."""
        missing = self.names - set(env)
        if missing:
            raise ExpressionError(f"{self.text!r} needs a value for {', '.join(sorted(missing))}")
        return self._eval(self.tree.body, env)

    def evaluate_int(self, env: Mapping[str, Any]) -> int:
        """Evaluate to one integer (shapes, grid and block sizes); refuses a fractional result."""
        value = self.evaluate(env)
        as_float = float(value)
        if as_float != int(as_float):
            raise ExpressionError(f"{self.text!r} gives {as_float}, expected a whole number")
        return int(as_float)

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name(id=name):
                return env[name]
            case ast.BinOp(left=left, op=op, right=right):
                return _BINARY[type(op)](self._eval(left, env), self._eval(right, env))
            case ast.UnaryOp(op=op, operand=operand):
                return _UNARY[type(op)](self._eval(operand, env))
            case ast.BoolOp(op=op, values=values):
                combine = np.logical_and if isinstance(op, ast.And) else np.logical_or
                result = self._eval(values[0], env)
                for value in values[1:]:
                    result = combine(result, self._eval(value, env))
                return result
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                result: Any = True
                current = self._eval(left, env)
                for op, comparator in zip(ops, comparators, strict=True):
                    right = self._eval(comparator, env)
                    result = np.logical_and(result, _COMPARE[type(op)](current, right))
                    current = right
                return result
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return np.where(
                    self._eval(test, env), self._eval(body, env), self._eval(orelse, env)
                )
            case ast.Call(func=ast.Name(id=name), args=args):
                return FUNCTIONS[name](*(self._eval(arg, env) for arg in args))
        raise ExpressionError(f"{self.text!r}: cannot evaluate {_describe(node)}")  # unreachable
