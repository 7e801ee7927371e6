"""The ``hermes`` tool-call parser: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""

from __future__ import annotations

import json
import re
from typing import Any

import rlzoo
from rlzoo.interfaces import MalformedCall, ParsedTurn, ToolCall, ToolCallParser

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)
_SHOWN = 200  # characters of a malformed call quoted back to the model


@rlzoo.register("tool_parser", "hermes")
class HermesParser(ToolCallParser):
    """Parse ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes / Qwen chat templates).

    Every block in the text is one call, in order (several per turn). A block is malformed, never an exception,
    when its body is not JSON, not a JSON object, has no non-empty string ``"name"``, or has ``"arguments"`` that
    are neither an object nor a string holding a JSON object (the OpenAI style); missing ``"arguments"`` are
    ``{}``. A ``<tool_call>`` without its ``</tool_call>`` (a response cut off by the token limit) is malformed
    too. ``content`` is the text with the blocks removed. ``format_result`` wraps an observation as the Qwen2.5 /
    Qwen3 templates render a tool message: ``<tool_response>\\n{content}\\n</tool_response>``.
    Reference: verl ``verl/experimental/agent_loop/tool_parser.py`` (``HermesToolParser``); the Hermes
    function-calling format (NousResearch/Hermes-Function-Calling).
    """

    call_markup = '<tool_call>{"name":"","arguments":{}}</tool_call>'  # format_call of a call with no name or arguments
    reference = "verl HermesToolParser; NousResearch Hermes function calling"
    verl_name = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        items: list[ToolCall | MalformedCall] = []
        for match in _BLOCK.finditer(text):
            body, closed = match.group(1), bool(match.group(2))
            if not closed:
                items.append(MalformedCall("<tool_call> is not closed by </tool_call>", _quote(body)))
                continue
            items.append(_call(body))
        content = _BLOCK.sub("", text).strip()
        return ParsedTurn(tuple(items), content)

    def format_result(self, name: str, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def format_call(self, call: ToolCall) -> str:
        """Compact JSON (no spaces: fewer tokens for a small model to write)."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, separators=(",", ":"))
        return f"<tool_call>{body}</tool_call>"


def _call(body: str) -> ToolCall | MalformedCall:
    shown = _quote(body)
    try:
        data: Any = json.loads(body)
    except json.JSONDecodeError as err:
        return MalformedCall(f"the body of <tool_call> is not valid JSON ({err.msg} at position {err.pos})", shown)
    except RecursionError:
        return MalformedCall("the body of <tool_call> is nested too deeply", shown)
    if not isinstance(data, dict):
        return MalformedCall(
            f'<tool_call> must hold a JSON object {{"name": ..., "arguments": {{...}}}}, not {_json_type(data)}', shown
        )
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall('the tool call has no "name" (a non-empty string)', shown)
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI style: the arguments object serialised as a string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return MalformedCall(f'the "arguments" of {name} are a string that is not valid JSON', shown)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return MalformedCall(f'the "arguments" of {name} must be a JSON object, not {_json_type(arguments)}', shown)
    return ToolCall(name.strip(), arguments)


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null"
    )


def _quote(body: str) -> str:
    body = body.strip()
    return body if len(body) <= _SHOWN else body[:_SHOWN] + "..."
