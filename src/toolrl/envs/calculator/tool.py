"""A calculator that evaluates arithmetic safely: parsed with `ast`, numbers and arithmetic operators only."""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**40

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ValueError("result is out of range")
        return value
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, found {type(node).__name__}")


def format_number(value: int | float) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("result is not a finite number")
        if value.is_integer():
            return str(int(value))
        return f"{value:.6g}" if abs(value) < 1e-4 else str(round(value, 6))
    return str(value)


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text; raises ValueError with a short reason."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**").replace("×", "*"), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r} as arithmetic") from None
    try:
        return format_number(_eval(tree.body))
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, for example "(12 + 3) * 4".
    """
    return evaluate(expression)
