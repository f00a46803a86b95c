"""A safe arithmetic calculator: Python's `ast` parser with a whitelist, never `eval`.

Supports + - * / // % **, parentheses, unary minus/plus, integers, decimals, scientific
notation and a few functions (abs, round, min, max, sqrt). Integer powers and results are
bounded in size, so "9**9**9" is an error message rather than a hung process.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from agentax.records import ToolResult
from agentax.tools._tool import Tool, tool

__all__ = ["CalculatorError", "evaluate", "calculator"]

MAX_EXPRESSION_CHARS = 2000
MAX_INT_BITS = 13_000
"""Largest integer (in bits, ~3900 decimal digits, under Python's int->str limit) a result may reach."""

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_SYMBOLS = {ast.BitXor: "^ (use ** for powers)", ast.BitAnd: "&", ast.BitOr: "|",
            ast.LShift: "<<", ast.RShift: ">>", ast.MatMult: "@"}


class CalculatorError(ValueError):
    """The expression cannot be evaluated; the message is meant for the model."""


def _check_size(value: Any) -> Any:
    if isinstance(value, complex):
        raise CalculatorError("result is a complex number (e.g. a fractional power of a negative number)")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits, about 3900 digits)")
    return value


def _power(base: Any, exponent: Any) -> Any:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise CalculatorError(f"exponent too large: {base}**{exponent} exceeds {MAX_INT_BITS} bits")
    return base**exponent


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"unsupported syntax: literal {node.value!r} (only numbers are allowed)")
        return _check_size(node.value)
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op not in _BINARY:
            raise CalculatorError(f"unsupported syntax: operator {_SYMBOLS.get(op, op.__name__)}")
        left, right = _eval(node.left), _eval(node.right)
        fn = _power if op is ast.Pow else _BINARY[op]
        return _check_size(fn(left, right))
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise CalculatorError(f"unsupported syntax: unary {type(node.op).__name__}")
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unsupported syntax: unknown name '{node.id}'")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
            allowed = ", ".join(_FUNCTIONS)
            raise CalculatorError(f"unsupported syntax: only these functions may be called: {allowed}")
        args = [_eval(a) for a in node.args]
        return _check_size(_FUNCTIONS[node.func.id](*args))
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> int | float:
    """Evaluates an arithmetic expression with Python's semantics (8/2 == 4.0, 7//2 == 3).

    Raises:
        CalculatorError: syntax outside the whitelist, division by zero, results too large.
    """
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    if not text:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        msg = getattr(e, "msg", None) or str(e)
        raise CalculatorError(f"unsupported syntax: cannot parse expression ({msg})") from None
    try:
        return _eval(tree)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large (numeric overflow)") from None
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None
    except (TypeError, ValueError) as e:
        raise CalculatorError(f"invalid operation: {e}") from None


def _format(value: int | float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _calculator(expression: str) -> ToolResult | str:
    """Evaluates an arithmetic expression and returns the number.

    Supports + - * / // % ** and parentheses, decimals, scientific notation, and the functions
    abs, round, min, max, sqrt, and the constants pi and e.

    Args:
        expression: The arithmetic expression, e.g. "(3 + 4.5) * 2 ** 3".
    """
    try:
        return _format(evaluate(expression))
    except CalculatorError as e:
        return ToolResult(name="calculator", content=f"Error: {e}", ok=False, error="bad_expression")


calculator: Tool = tool(_calculator, name="calculator", timeout_s=5.0)
"""The calculator tool: one argument `expression: str`."""
