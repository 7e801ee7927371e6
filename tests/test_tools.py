"""The tool-call runner (rlzoo.tools): every failure of a call is an error observation and a counted outcome,
never an exception; a hung tool does not hold up the turn; one turn's calls run concurrently."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
from pydantic import Field

from rlzoo.interfaces import MalformedCall, Params, ParsedTurn, Tool, ToolCall, ToolError, ToolTimeout
from rlzoo.tools import OUTCOMES, abandoned_calls, count_outcomes, run_tool_calls


class Echo(Tool):
    """Return the text argument."""

    name = "echo"
    description = "echo the text"
    parameters: ClassVar[dict] = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    def call(self, arguments: dict[str, Any]) -> str:
        return arguments["text"] * arguments.get("times", 1)


class Sleep(Tool):
    """Sleep, then say so."""

    name = "sleep"
    parameters: ClassVar[dict] = {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]}

    class Params(Params):
        timeout_s: float = Field(0.3, gt=0)

    def call(self, arguments: dict[str, Any]) -> str:
        time.sleep(arguments["s"])
        return f"slept {arguments['s']}"


class Raises(Tool):
    """Raise what the argument says."""

    name = "raises"

    def call(self, arguments: dict[str, Any]) -> str:
        kind = arguments.get("kind")
        if kind == "tool":
            raise ToolError("bad input for this tool")
        if kind == "timeout":
            raise ToolTimeout("stopped itself at its budget")
        if kind == "exit":
            raise SystemExit(3)
        if kind == "number":
            return 42  # type: ignore[return-value]
        raise KeyError("boom")


TOOLS = {"echo": Echo(), "sleep": Sleep(), "raises": Raises()}


def statuses(outcomes) -> list[str]:
    return [o.status for o in outcomes]


def test_ok_calls_return_their_observations_in_order():
    outcomes = run_tool_calls([ToolCall("echo", {"text": "ab", "times": 2}), ToolCall("echo", {"text": "c"})], TOOLS)
    assert [(o.name, o.status, o.content) for o in outcomes] == [("echo", "ok", "abab"), ("echo", "ok", "c")]
    assert all(o.ok for o in outcomes)


def test_unknown_tool():
    (outcome,) = run_tool_calls([ToolCall("search", {"q": "x"})], TOOLS)
    assert outcome.status == "unknown" and outcome.name == "search"
    assert outcome.content == "Error: unknown tool 'search'; available tools: echo, raises, sleep"
    (outcome,) = run_tool_calls([ToolCall("search", {})], {})
    assert outcome.content.endswith("available tools: none")


def test_malformed_calls_from_the_parser_or_as_strings():
    turn = ParsedTurn((MalformedCall("the body is not valid JSON", "{x"), ToolCall("echo", {"text": "y"})), "")
    outcomes = run_tool_calls(turn, TOOLS)
    assert statuses(outcomes) == ["malformed", "ok"]
    assert outcomes[0].content == "Error: malformed tool call: the body is not valid JSON"
    (outcome,) = run_tool_calls(["no name"], TOOLS)
    assert (outcome.status, outcome.content) == ("malformed", "Error: malformed tool call: no name")
    (outcome,) = run_tool_calls([42], TOOLS)  # type: ignore[list-item]
    assert outcome.status == "malformed"


@pytest.mark.parametrize(
    ("kind", "status", "content"),
    [
        ("tool", "error", "Error: raises: bad input for this tool"),
        ("timeout", "timeout", "Error: raises: stopped itself at its budget"),
        ("other", "error", "Error: raises failed: KeyError: 'boom'"),
        ("exit", "error", "Error: raises failed: SystemExit: 3"),
        ("number", "error", "Error: raises returned int, not text"),
    ],
)
def test_a_raising_tool_is_an_error_observation(kind, status, content):
    (outcome,) = run_tool_calls([ToolCall("raises", {"kind": kind})], TOOLS)
    assert (outcome.status, outcome.content) == (status, content)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument(s) text; echo takes (text: string, times: integer)"),
        ({"text": "a", "loud": True}, "unknown argument(s) loud; echo takes (text: string, times: integer)"),
        ({"text": 3}, "argument 'text' must be of type string, not int"),
        ({"text": "a", "times": True}, "argument 'times' must be of type integer, not bool"),
        ({"text": "a", "times": 1.5}, "argument 'times' must be of type integer, not float"),
        ("text", "arguments must be a JSON object, not str"),
    ],
)
def test_arguments_that_do_not_fit_the_schema(arguments, message):
    (outcome,) = run_tool_calls([ToolCall("echo", arguments)], TOOLS)
    assert outcome.status == "error" and outcome.content == f"Error: echo: {message}"


def test_a_tool_past_its_budget_does_not_block_the_turn():
    release = threading.Event()

    class Hangs(Tool):
        """Wait until released (a hung in-process tool)."""

        name = "hangs"
        default_timeout_s = 0.3

        def call(self, arguments: dict[str, Any]) -> str:
            release.wait(30)
            return "late"

    before = abandoned_calls()
    start = time.monotonic()
    outcomes = run_tool_calls([ToolCall("hangs", {}), ToolCall("echo", {"text": "x"})], {**TOOLS, "hangs": Hangs()})
    elapsed = time.monotonic() - start
    assert statuses(outcomes) == ["timeout", "ok"]
    assert outcomes[0].content == "Error: hangs timed out after 0.3 s"
    assert 0.25 < elapsed < 0.6 and 0.25 < outcomes[0].seconds < 0.6
    assert abandoned_calls() == before + 1  # the thread cannot be killed; it is counted until it returns
    release.set()
    deadline = time.monotonic() + 5
    while abandoned_calls() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_calls() == before


def test_the_turn_timeout_caps_each_budget():
    start = time.monotonic()
    (outcome,) = run_tool_calls([ToolCall("sleep", {"s": 0.5})], TOOLS, timeout=0.1)
    assert outcome.status == "timeout" and outcome.content == "Error: sleep timed out after 0.1 s"
    assert time.monotonic() - start < 0.3
    (outcome,) = run_tool_calls([ToolCall("sleep", {"s": 0.05})], TOOLS, timeout=10)  # the tool's own 0.3 s holds
    assert outcome.ok


def test_a_parameter_sets_the_budget():
    slow = Sleep(Sleep.Params(timeout_s=1.0))
    assert slow.timeout_s == 1.0 and Sleep().timeout_s == 0.3 and Echo().timeout_s == 5.0
    (outcome,) = run_tool_calls([ToolCall("sleep", {"s": 0.5})], {"sleep": slow})
    assert outcome.content == "slept 0.5"


def test_calls_of_one_turn_run_concurrently():
    slow = Sleep(Sleep.Params(timeout_s=2.0))
    start = time.monotonic()
    outcomes = run_tool_calls([ToolCall("sleep", {"s": 0.5}), ToolCall("sleep", {"s": 0.5})], {"sleep": slow})
    assert statuses(outcomes) == ["ok", "ok"] and time.monotonic() - start < 0.8


def test_max_calls():
    calls = [ToolCall("echo", {"text": str(i)}) for i in range(4)]
    outcomes = run_tool_calls(calls, TOOLS, max_calls=2)
    assert statuses(outcomes) == ["ok", "ok", "error", "error"]
    assert outcomes[2].content == "Error: too many tool calls in one turn (at most 2)"


def test_counts_cover_every_status():
    outcomes = run_tool_calls(
        [
            ToolCall("echo", {"text": "a"}),
            ToolCall("nope", {}),
            "bad",
            ToolCall("raises", {}),
            ToolCall("sleep", {"s": 0.5}),
            ToolCall("echo", {"text": "b"}),
        ],
        TOOLS,
    )
    assert count_outcomes(outcomes) == {"ok": 2, "error": 1, "timeout": 1, "unknown": 1, "malformed": 1}
    assert count_outcomes([]) == dict.fromkeys(OUTCOMES, 0)


def test_schema_is_the_openai_function_dict():
    assert Echo().schema() == {
        "type": "function",
        "function": {"name": "echo", "description": "echo the text", "parameters": Echo.parameters},
    }
