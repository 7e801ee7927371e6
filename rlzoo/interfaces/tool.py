"""Tools and tool-call parsers: the components a multi-turn episode calls between generations.

A :class:`Tool` has a name, a description and a JSON schema of its arguments; :meth:`Tool.schema` is the
OpenAI function-calling dict that chat templates take through ``tools=`` (``apply_chat_template(messages,
tools=[t.schema() for t in tools])``), and :meth:`Tool.call` returns the observation text. A
:class:`ToolCallParser` finds the calls in the model's text (:meth:`ToolCallParser.parse`) and shows a result to
the model (:meth:`ToolCallParser.format_result`). The core runner :func:`rlzoo.tools.run_tool_calls` runs one
turn's calls under their time budgets and turns every failure into an error observation and a counted outcome.

References: verl ``verl/experimental/agent_loop/tool_parser.py`` (``HermesToolParser``) and ``tool_agent_loop.py``;
TRL ``GRPOTrainer(tools=...)``; OpenAI's function-calling format for the schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlzoo.errors import RlzooError
from rlzoo.interfaces.base import Component


class ToolError(RlzooError):
    """Raised by :meth:`Tool.call` for a failure the model should read (bad arguments, a refused expression).

    The runner shows ``str(error)`` to the model and counts the call as ``error``; any other exception is shown
    as ``<ExceptionType>: <message>`` and counted the same way.
    """


class ToolTimeout(ToolError):
    """Raised by a tool that enforces its own time budget (the ``python`` tool's sandbox killed the code); the
    runner counts the call as ``timeout``, exactly as when the runner itself stops waiting."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call found in the model's text: the tool's ``name`` and its ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MalformedCall:
    """A call the parser could not read: ``error`` says why (shown to the model), ``text`` is what it saw."""

    error: str
    text: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """What a parser found in one generation.

    items:   the calls in the order they appear, well-formed (:class:`ToolCall`) or not (:class:`MalformedCall`).
    content: the text with every call removed (what the model said besides calling tools).
    """

    items: tuple[ToolCall | MalformedCall, ...] = ()
    content: str = ""

    @property
    def calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]

    @property
    def errors(self) -> list[str]:
        """Why each malformed call could not be read."""
        return [i.error for i in self.items if isinstance(i, MalformedCall)]

    @property
    def has_calls(self) -> bool:
        """Whether the model tried to call a tool (well-formed or not): an episode ends at a turn without."""
        return bool(self.items)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


class Tool(Component):
    """``call(arguments) -> str``: run the tool on the parsed arguments and return the observation text.

    Subclasses set ``name``, ``description`` (what the model reads) and ``parameters`` (a JSON schema of the
    arguments object: ``{"type": "object", "properties": {...}, "required": [...]}``). ``timeout_s`` is the
    call's time budget; a tool with a ``timeout_s`` parameter uses that instead of the class default. ``call``
    may raise: :class:`ToolError` for an error the model should read, :class:`ToolTimeout` when the tool stopped
    itself at its budget; the runner never lets an exception escape a turn. ``call`` is run in a worker thread,
    possibly concurrently with other calls of the same tool, so it must not keep per-call state on ``self``.
    A tool that could hang must bound itself (or run in a subprocess it kills, as ``python`` does): a thread
    cannot be killed, see :func:`rlzoo.tools.run_tool_calls`.
    """

    kind = "tool"
    metric_namespace = "tool"
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    #: the default time budget of one call, in seconds (a ``timeout_s`` parameter overrides it)
    default_timeout_s: ClassVar[float] = 5.0

    @property
    def timeout_s(self) -> float:
        return float(getattr(self.params, "timeout_s", self.default_timeout_s))

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling description chat templates take through ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def call(self, arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit :attr:`parameters` (required keys, unknown keys when
        ``additionalProperties`` is false, the top-level JSON types), or ``None``. The runner calls it before
        :meth:`call`; it is a shallow check, not a full JSON-schema validator."""
        props: dict[str, Any] = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"missing required argument(s) {', '.join(missing)}; {self.name} takes {_signature(props)}"
        if self.parameters.get("additionalProperties") is False:
            unknown = [k for k in arguments if k not in props]
            if unknown:
                return f"unknown argument(s) {', '.join(unknown)}; {self.name} takes {_signature(props)}"
        for key, value in arguments.items():
            wanted = props.get(key, {}).get("type")
            if wanted is None:
                continue
            names = [wanted] if isinstance(wanted, str) else list(wanted)
            types = tuple(t for n in names for t in _JSON_TYPES.get(n, (object,)))
            is_bool = isinstance(value, bool) and "boolean" not in names
            if is_bool or not isinstance(value, types):
                return f"argument {key!r} must be of type {' or '.join(names)}, not {type(value).__name__}"
        return None


def _signature(props: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items()) + ")" if props else "no arguments"


class ToolCallParser(Component):
    """``parse(text) -> ParsedTurn``: the tool calls in one generation; ``format_result(name, content) -> str``:
    how a tool's observation is shown to the model; ``format_call(call) -> str``: how the model writes a call.

    ``parse`` never raises on the model's text: a call it cannot read is a :class:`MalformedCall` with the reason,
    which the runner turns into an error observation counted as ``malformed``.

    ``call_markup`` declares the text every call is written with, whatever its tool and arguments (``hermes``:
    ``<tool_call>{"name":"","arguments":{}}</tool_call>``): a policy whose tokenizer cannot write one of its
    characters (a tiny model's character tokenizer, built from the task's alphabet) never makes a call, so the
    preflight refuses it (:func:`rlzoo.episodes.rules.tool_markup_rule`). ``""``: nothing declared, not checked.
    """

    kind = "tool_parser"
    metric_namespace = "tool_parser"
    call_markup: ClassVar[str] = ""

    def parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError

    def format_result(self, name: str, content: str) -> str:
        raise NotImplementedError

    def format_call(self, call: ToolCall) -> str:
        """``call`` written as the model writes it (``parse(format_call(c))`` finds ``c``): demonstrations of the
        cold start are rendered with it."""
        raise NotImplementedError(f"tool-call parser {self.name!r} cannot write a call (format_call)")
