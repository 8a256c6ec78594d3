"""What every client program here shares (they run in venvs of their own, without toolrl): the task's question,
the calculator tool's arithmetic, and the result printed as the program's last line (what the agent environment
reads)."""

from __future__ import annotations

import ast
import json
import operator
import os

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg}  # fmt: skip


def question() -> str:
    """The task's question (the agent environment sets TOOLRL_QUESTION; TOOLRL_TASK holds the whole task)."""
    return os.environ.get("TOOLRL_QUESTION") or json.loads(os.environ["TOOLRL_TASK"])["question"]


def calculate(expression: str) -> str:
    """The model's expression is untrusted: arithmetic parsed with ast, never eval()."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and abs(node.value) < 1e12:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / are allowed")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(result) if float(result).is_integer() else result)


def finish(result: object) -> None:
    print(json.dumps(str(result)))
