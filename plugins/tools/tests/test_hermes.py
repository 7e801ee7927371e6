"""The hermes parser: well-formed calls, several per turn, malformed ones (reported, never raised), none."""

from __future__ import annotations

import json
import re

import pytest

from rlzoo.interfaces import MalformedCall, ParsedTurn, ToolCall
from rlzoo_tools.hermes import HermesParser

PARSER = HermesParser()


def block(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def test_one_call():
    turn = PARSER.parse(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    )
    assert turn.items == (ToolCall("calculator", {"expression": "1+1"}),)
    assert turn.calls == [ToolCall("calculator", {"expression": "1+1"})] and turn.errors == []
    assert turn.content == "Let me compute." and turn.has_calls


def test_several_calls_in_order():
    text = (
        "a"
        + block('{"name": "python", "arguments": {"code": "print(1)"}}')
        + " b "
        + block('{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}')
        + block('{"name": "clock"}')
    )
    turn = PARSER.parse(text)
    assert [c.name for c in turn.calls] == ["python", "calculator", "clock"]
    assert turn.calls[1].arguments == {"expression": "2*3"}  # OpenAI style: arguments as a JSON string
    assert turn.calls[2].arguments == {}
    assert turn.content == "a b"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{name: calculator}", "not valid JSON"),
        ('{"name": "calculator", "arguments": {"expression": "1+1"}', "not valid JSON"),
        ("", "not valid JSON"),
        ('["calculator"]', "must hold a JSON object"),
        ('{"arguments": {"expression": "1"}}', 'no "name"'),
        ('{"name": "", "arguments": {}}', 'no "name"'),
        ('{"name": 3, "arguments": {}}', 'no "name"'),
        ('{"name": "calculator", "arguments": [1, 2]}', "must be a JSON object, not an array"),
        ('{"name": "calculator", "arguments": "not json"}', "not valid JSON"),
        ('{"name": "calculator", "arguments": "[1]"}', "must be a JSON object"),
        ("[" * 100000 + "]" * 100000, "nested too deeply|not valid JSON"),
    ],
)
def test_malformed_calls_are_reported_not_raised(body, message):
    turn = PARSER.parse("x " + block(body))
    assert len(turn.items) == 1 and turn.calls == []
    (item,) = turn.items
    assert isinstance(item, MalformedCall)
    assert turn.errors == [item.error]
    assert re.search(message, item.error), item.error
    assert len(item.text) <= 203  # quoted back, bounded
    assert turn.has_calls  # the model tried: the episode goes on with an error observation


def test_malformed_beside_well_formed_keeps_the_order():
    turn = PARSER.parse(block("{oops}") + block('{"name": "calculator", "arguments": {"expression": "2"}}'))
    assert isinstance(turn.items[0], MalformedCall) and turn.items[1] == ToolCall("calculator", {"expression": "2"})


def test_an_unclosed_call_is_malformed():
    turn = PARSER.parse('answer: <tool_call>{"name": "calculator", "argum')
    assert turn.calls == [] and "not closed" in turn.errors[0]
    assert turn.content == "answer:"


def test_no_calls():
    for text in ["The answer is 4.", "", "I would use </tool_call> here", "<tool_response>4</tool_response>"]:
        turn = PARSER.parse(text)
        assert turn == ParsedTurn((), text.strip()) and not turn.has_calls


def test_round_trip_of_a_random_arguments_object():
    arguments = {"code": 'print("<tool_call>")\n', "n": [1, 2.5, None], "nested": {"k": True}}
    turn = PARSER.parse(block(json.dumps({"name": "python", "arguments": arguments})))
    assert turn.calls == [ToolCall("python", arguments)]


def test_format_result_is_the_qwen_tool_response():
    assert PARSER.format_result("calculator", "4") == "<tool_response>\n4\n</tool_response>"


def test_the_declared_call_markup_is_what_every_written_call_holds():
    """``call_markup`` (what the preflight checks the policy's tokenizer against) is a call with no name and no
    arguments as ``format_call`` writes it, and every written call holds each of its characters."""
    assert HermesParser.call_markup == PARSER.format_call(ToolCall("", {}))
    written = PARSER.format_call(ToolCall("calculator", {"expression": "537*853"}))
    assert set(HermesParser.call_markup) <= set(written)
    assert PARSER.parse(written).calls == [ToolCall("calculator", {"expression": "537*853"})]
