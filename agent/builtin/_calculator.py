"""The demo agent's calculator: find an arithmetic expression and evaluate it safely.

Only numbers, + - * / // % ** and parentheses are evaluated, by walking the
``ast`` (never ``eval``), with bounds on length, exponents and magnitudes so a
message cannot make the worker compute for long or allocate huge integers.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable

MAX_LENGTH = 200
MAX_MAGNITUDE = 10**100

Number = int | float

# Runs of characters an expression may contain.
_RUN = re.compile(r"[\d\s+\-*/%().]+")
# At least one binary operator between two operands.
_HAS_OPERATION = re.compile(r"[\d.)]\s*(\*\*|//|[-+*/%])\s*[-+(]*\s*[\d.(]")

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class CalculationError(ValueError):
    """The expression is not allowed or has no finite result."""


def find_expression(text: str) -> str | None:
    """The first arithmetic expression in ``text`` (e.g. ``12*(3+4)``), if any."""
    for run in _RUN.findall(text):
        candidate = str(run).strip().rstrip(".").strip()
        if _HAS_OPERATION.search(candidate):
            return candidate
    return None


def calculate(expression: str) -> str:
    """The value of ``expression`` as text, or ``"error: <reason>"``; never raises."""
    try:
        return _format(evaluate(expression))
    except CalculationError as exc:
        return f"error: {exc}"


def evaluate(expression: str) -> Number:
    if len(expression) > MAX_LENGTH:
        raise CalculationError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise CalculationError("invalid expression") from None
    return _eval(tree.body)


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculationError("only numbers are allowed")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculationError("division by zero") from None
        except OverflowError:
            raise CalculationError("result too large") from None
        return _checked(result)
    raise CalculationError("only numbers and + - * / // % ** ( ) are allowed")


def _check_power(base: Number, exponent: Number) -> None:
    # Refuse before computing: 10**10**10 would hang the worker.
    if abs(exponent) > 1000:
        raise CalculationError("exponent too large")
    if abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > 100:
        raise CalculationError("result too large")


def _checked(value: object) -> Number:
    if isinstance(value, complex):
        raise CalculationError("result is not a real number")
    if not isinstance(value, int | float):
        raise CalculationError("unsupported value")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("result too large")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError("result too large")
    return value


def _format(value: Number) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".12g")
    return str(value)
