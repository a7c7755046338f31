"""Safe arithmetic: an ``ast`` walk over numbers, operators and a few functions, never ``eval``.

Rationals stay exact (``Fraction``), so integer products and sums of decimals come back exact;
a math function or a fractional power switches to float. Every intermediate value is bounded
(``MAX_DIGITS``) and powers are sized before they are computed, so ``9**9**9`` fails at once.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction

from esbox.adapters.agents.tools import ToolError

MAX_LENGTH = 1000  # characters of an expression
MAX_DEPTH = 64  # nesting of the expression tree
MAX_DIGITS = 1000  # decimal digits of any numerator, denominator or result
SIGNIFICANT = 15  # digits shown for a non-integer result

Number = Fraction | float
_MAX_BITS = int(MAX_DIGITS * math.log2(10))

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_HINTS = {ast.BitXor: "use ** for powers, not ^"}


def _log(x: Number, base: Number = math.e) -> float:
    return math.log(x, base)


FUNCTIONS: dict[str, Callable[..., Number | int]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "log": _log,
    "log10": math.log10,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; ``ToolError`` names what is not allowed or too big."""
    if not isinstance(expression, str):
        raise ToolError("the expression must be a string")
    if len(expression) > MAX_LENGTH:
        raise ToolError(f"expression too long ({len(expression)} > {MAX_LENGTH} characters)")
    if not expression.strip():
        raise ToolError("empty expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ToolError(f"not an arithmetic expression: {expression.strip()!r}") from exc
    try:
        return _checked(_eval(tree.body, 0))
    except ToolError:
        raise
    except ZeroDivisionError as exc:
        raise ToolError("division by zero") from exc
    except OverflowError as exc:
        raise ToolError("result too large") from exc
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolError(f"cannot evaluate: {exc}") from exc


def format_number(value: Number) -> str:
    """An integer exactly, anything else to ``SIGNIFICANT`` digits without float noise."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    context = Context(prec=SIGNIFICANT)
    if isinstance(value, Fraction):
        decimal = context.divide(Decimal(value.numerator), Decimal(value.denominator))
    else:
        decimal = context.create_decimal(repr(value))
    decimal = decimal.normalize(context)
    if decimal == decimal.to_integral_value() and abs(decimal.adjusted()) < SIGNIFICANT:
        return str(int(decimal))
    if -7 < decimal.adjusted() < SIGNIFICANT:
        return format(decimal, "f")
    return str(decimal).replace("E", "e")


def calculate(expression: str) -> str:
    """``evaluate`` then ``format_number``: the text the calculator tool returns."""
    return format_number(evaluate(expression))


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if type(node.op) in _BINARY:
            return _checked(_BINARY[type(node.op)](left, right))
        hint = _HINTS.get(type(node.op), "allowed: + - * / // % **")
        raise ToolError(f"operator {type(node.op).__name__} not allowed ({hint})")
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r} (constants: {', '.join(CONSTANTS)})")
    if isinstance(node, ast.Call):
        return _call(node, depth)
    raise ToolError(f"{type(node).__name__} not allowed in an arithmetic expression")


def _constant(value: object) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"only numbers are allowed, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("number too large")
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _call(node: ast.Call, depth: int) -> Number:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in FUNCTIONS:
        raise ToolError(f"only these functions may be called: {', '.join(FUNCTIONS)}")
    if node.keywords:
        raise ToolError(f"{name}() takes positional arguments only")
    args = [_eval(arg, depth + 1) for arg in node.args]
    if name == "round" and len(args) == 2:
        args[1] = _integer(args[1], "round's digits")
    return _checked(FUNCTIONS[name](*args))


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        if isinstance(base, Fraction):
            _check_power_size(base, exponent.numerator)
        return base**exponent.numerator
    result = float(base) ** float(exponent)
    if isinstance(result, complex):
        raise ToolError("a negative number to a fractional power is not a real number")
    return result


def _check_power_size(base: Fraction, exponent: int) -> None:
    """Reject a power whose numerator or denominator would exceed ``MAX_DIGITS``."""
    largest = max(abs(base.numerator), base.denominator)
    if largest > 1 and abs(exponent) * math.log2(largest) > _MAX_BITS:
        raise ToolError(f"result too large (more than {MAX_DIGITS} digits)")


def _integer(value: Number, what: str) -> int:
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    raise ToolError(f"{what} must be an integer")


def _checked(value: Number | int) -> Number:
    """``value`` as a finite float or a bounded ``Fraction`` (``//`` and ``round`` give ints)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError("result too large or undefined")
        return value
    if max(abs(value.numerator), value.denominator).bit_length() > _MAX_BITS:
        raise ToolError(f"result too large (more than {MAX_DIGITS} digits)")
    return Fraction(value)
