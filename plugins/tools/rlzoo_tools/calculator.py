"""The ``calculator`` tool: exact arithmetic on a parsed expression, never ``eval``."""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction
from typing import Any

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Tool, ToolError

_LITERAL = re.compile(r"(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?")
_ALLOWED = "numbers, + - * / // % **, unary minus and parentheses"
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
_REFUSED = {
    ast.Name: "names are not allowed",
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "subscripts are not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "and/or are not allowed",
    ast.Lambda: "lambdas are not allowed",
}


@rlzoo.register("tool", "calculator")
class Calculator(Tool):
    """Evaluate an arithmetic expression exactly (rational numbers), e.g. ``(2**64 + 1) / 3``.

    The expression is parsed with :mod:`ast` and only numbers (integers and decimal literals such as ``0.1`` or
    ``1e-3``, read exactly from their text), ``+ - * / // % **``, unary ``+``/``-`` and parentheses are evaluated,
    with :class:`fractions.Fraction`: no rounding, no float error, no names, calls or attributes (never ``eval``).
    ``//`` and ``%`` follow Python (``//`` floors, ``%`` takes the divisor's sign). ``**`` takes a whole-number
    exponent only (``2 ** 0.5`` is irrational, so refused). Bounded so that no expression can hang: at most
    ``max_length`` characters, and every number along the way (numerator and denominator) at most ``max_digits``
    digits; a power whose result would be larger is refused before it is computed.

    The result: an integer prints as an integer (``12``); a fraction whose decimal expansion ends within
    ``max_decimals`` places prints as that exact decimal (``0.5``, ``-1.125``); any other as the reduced fraction
    ``p/q`` (``1/3``), which is exact where a rounded decimal would not be. A refused or failing expression
    (division by zero, a name, a huge power) is a :class:`rlzoo.interfaces.ToolError`: the model reads why.
    Reference: the calculator tools of ToRA / verl's GSM8K tool recipes, made exact.
    """

    reference = "verl tool recipes (gsm8k calc tool); Python fractions/ast"
    description = (
        "Evaluate an arithmetic expression exactly. Supports integers, decimals, + - * / // % ** and parentheses; "
        "results are exact (integers, terminating decimals, or fractions p/q)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "the expression, e.g. (12 + 3) * 7 / 2"},
        },
        "required": ["expression"],
        "additionalProperties": False,
    }
    default_timeout_s = 2.0

    class Params(Params):
        max_length: int = Field(1000, ge=1, le=10000, description="longest expression, in characters")
        max_digits: int = Field(1000, ge=10, le=4000, description="largest number along the way, in digits")
        max_decimals: int = Field(20, ge=0, le=100, description="longest decimal expansion printed as a decimal")
        timeout_s: float = Field(2.0, gt=0, le=60, description="time budget of one call")

    def call(self, arguments: dict[str, Any]) -> str:
        return format_number(self.evaluate(arguments["expression"]), self.params.max_decimals)

    def evaluate(self, expression: str) -> Fraction:
        """The exact value of ``expression``; :class:`ToolError` saying why it is refused."""
        p = self.params
        if len(expression) > p.max_length:
            raise ToolError(f"the expression is {len(expression)} characters long; the limit is {p.max_length}")
        if not expression.strip():
            raise ToolError("the expression is empty")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as err:
            raise ToolError(f"cannot parse the expression: {err.msg}") from None
        except (ValueError, RecursionError, MemoryError):
            raise ToolError("cannot parse the expression (too deeply nested or too long)") from None
        evaluator = _Evaluator(expression.strip(), math.ceil(p.max_digits * math.log2(10)), p.max_digits)
        try:
            return evaluator.value(tree.body)
        except RecursionError:
            raise ToolError("the expression is too deeply nested") from None


class _Evaluator:
    def __init__(self, source: str, max_bits: int, max_digits: int) -> None:
        self.source, self.max_bits, self.max_digits = source, max_bits, max_digits

    def value(self, node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant):
            return self.checked(self.constant(node))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.value(node.left), self.value(node.right)
            return self.checked(self.binary(node.op, left, right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
            raise ToolError("^ is not supported; use ** for powers")
        why = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed")
        raise ToolError(f"{why} ({ast.get_source_segment(self.source, node) or ''}); use {_ALLOWED}")

    def constant(self, node: ast.Constant) -> Fraction:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolError(f"only numbers are allowed, not {value!r}; use {_ALLOWED}")
        if isinstance(value, int):
            return Fraction(value)
        # a decimal literal: read exactly from its text (0.1 is 1/10, 1e-400 is not 0), exponent bounded first
        text = (ast.get_source_segment(self.source, node) or repr(value)).replace("_", "")
        match = _LITERAL.fullmatch(text)
        if match is None or not (match.group(1) or match.group(2)):
            raise ToolError(f"cannot read the number {text!r}")
        if match.group(3) is not None and abs(int(match.group(3))) > self.max_digits:
            raise ToolError(f"the number {text} has more than {self.max_digits} digits")
        return Fraction(text)

    def binary(self, op: ast.operator, a: Fraction, b: Fraction) -> Fraction:
        try:
            if isinstance(op, ast.Add):
                return a + b
            if isinstance(op, ast.Sub):
                return a - b
            if isinstance(op, ast.Mult):
                return a * b
            if isinstance(op, ast.Div):
                return a / b
            if isinstance(op, ast.FloorDiv):
                return Fraction(a // b)
            if isinstance(op, ast.Mod):
                return a % b
            return self.power(a, b)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None

    def power(self, a: Fraction, b: Fraction) -> Fraction:
        if b.denominator != 1:
            raise ToolError(f"only whole-number exponents are allowed (the result of ** {b} may not be exact)")
        n = b.numerator
        if a == 0 and n < 0:
            raise ZeroDivisionError
        if abs(a.numerator) > 1 or a.denominator > 1:  # the result grows: refuse before computing it
            bits = max(abs(a.numerator).bit_length(), a.denominator.bit_length()) - 1
            if bits * abs(n) > self.max_bits:
                raise ToolError(f"the result of the power has more than {self.max_digits} digits")
        return a**n

    def checked(self, x: Fraction) -> Fraction:
        if max(abs(x.numerator).bit_length(), x.denominator.bit_length()) > self.max_bits:
            raise ToolError(f"a number along the way has more than {self.max_digits} digits")
        return x


def format_number(x: Fraction, max_decimals: int = 20) -> str:
    """``12``, ``0.5``, ``-1.125`` (a decimal expansion that ends within ``max_decimals`` places) or ``1/3``."""
    if x.denominator == 1:
        return str(x.numerator)
    rest, twos, fives = x.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    places = max(twos, fives)
    if rest != 1 or places > max_decimals:
        return f"{x.numerator}/{x.denominator}"
    scaled = abs(x.numerator) * 10**places // x.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if x < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"
