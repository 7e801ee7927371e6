"""The calculator: exact results, the printed form, and refusal (an error the model reads) of anything but
arithmetic or of a number too large to compute quickly."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from rlzoo.interfaces import ToolError
from rlzoo_tools.calculator import Calculator, format_number

CALC = Calculator()


def calc(expression: str) -> str:
    return CALC.call({"expression": expression})


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12345678901234567890 * 98765432109876543210", "1219326311370217952237463801111263526900"),
        ("1/3 + 1/6", "0.5"),
        ("1/3", "1/3"),
        ("0.1 + 0.2", "0.3"),  # read exactly from the text: no binary float error
        ("2 ** 100", "1267650600228229401496703205376"),
        ("(2**64 + 1) / 3", "18446744073709551617/3"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("7.5 % 2", "1.5"),
        ("-(3 - 5) * +2", "4"),
        ("2 ** -3", "0.125"),
        ("-9/8", "-1.125"),
        ("1e-400 * 1e400", "1"),  # not 0 * inf
        ("1_000 * 3", "3000"),
        ("10 / 4", "2.5"),
        ("6 / 3", "2"),  # an integral fraction prints as an integer
    ],
)
def test_exact_results(expression, expected):
    assert calc(expression) == expected


def test_the_value_is_exact():
    assert CALC.evaluate("1/3 * 3") == 1 and CALC.evaluate("1/7") == Fraction(1, 7)


def test_format_choice_decimal_only_when_it_terminates_within_max_decimals():
    assert format_number(Fraction(1, 2**20), 20) == "0.00000095367431640625"
    assert format_number(Fraction(1, 2**21), 20) == "1/2097152"
    assert format_number(Fraction(-1, 3)) == "-1/3"
    assert format_number(Fraction(-5, 4)) == "-1.25"
    assert Calculator(Calculator.Params(max_decimals=0)).call({"expression": "1/2"}) == "1/2"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("x + 1", "names are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1j * 1j", "only numbers are allowed"),
        ("[1][0]", "not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("lambda: 1", "lambdas are not allowed"),
        ("2 ^ 3", "use \\*\\* for powers"),
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 0.5", "whole-number exponents"),
        ("2 ** 100000", "more than 1000 digits"),
        ("9 ** 9 ** 9", "more than 1000 digits"),
        ("(1/3) ** 5000", "more than 1000 digits"),
        ("10 ** 999 * 10 ** 999", "more than 1000 digits"),
        ("1e999999999", "more than 1000 digits"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("(" * 300 + "1" + ")" * 300, "cannot parse"),
    ],
)
def test_refused_with_a_reason(expression, message):
    with pytest.raises(ToolError, match=message):
        calc(expression)


def test_length_is_bounded():
    with pytest.raises(ToolError, match="limit is 1000"):
        calc("1+" * 500 + "1")
    assert Calculator(Calculator.Params(max_length=2000)).call({"expression": "1+" * 500 + "1"}) == "501"


def test_hostile_expressions_finish_fast():
    start = time.monotonic()
    for expression in ["9**9**9**9", "(10**999)**(10**999)", "2**2**2**2**2**2", "-" * 900 + "1", "1" * 999]:
        try:
            calc(expression)
        except ToolError:
            pass
    assert time.monotonic() - start < 1.0


def test_schema_is_the_openai_function_format():
    schema = CALC.schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "calculator" and "exact" in function["description"]
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
