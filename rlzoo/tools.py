"""Run one turn's tool calls: concurrently, each under its time budget, never raising.

:func:`run_tool_calls` takes what a :class:`rlzoo.interfaces.ToolCallParser` found in one generation and the
episode's tools by name, starts every well-formed call of a known tool at once (one thread each), and returns
one :class:`ToolOutcome` per call, in the calls' order. Every failure becomes an observation the model reads
(starting ``Error:``) and a counted status instead of an exception:

==========  =========================================================================================
status      when
==========  =========================================================================================
ok          the tool returned its observation text
error       the arguments do not fit the tool's schema, the tool raised, or it returned something not text
timeout     the call did not finish within its budget (or the tool stopped itself: ``ToolTimeout``)
unknown     no tool of that name is available to the episode
malformed   the parser could not read the call (bad JSON, no name)
==========  =========================================================================================

A call's budget is its tool's ``timeout_s``, capped by ``timeout`` when given; since the calls run concurrently,
a turn takes about its slowest call's budget at most. A call past its budget is abandoned, not stopped: Python
cannot kill a thread, so an in-process tool that hangs keeps its (daemon) thread until its ``call`` returns, its
result discarded: its outcome says so (``abandoned``, counted in ``tool/abandoned``), and :func:`abandoned_calls`
counts such threads still running (the run's final summary reports both). Tools that may hang must therefore
bound themselves or work in a subprocess they kill: the ``python`` tool's sandbox is killed at its own
``timeout_s``. Reference: verl's ``tool_agent_loop.py`` (tools run concurrently with ``asyncio.gather``).

A tool whose every call of a batch of episodes failed is named once on the console (:func:`failing_tools` finds it;
:mod:`rlzoo.episodes.faults` warns).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlzoo.interfaces.tool import MalformedCall, ParsedTurn, Tool, ToolCall, ToolError, ToolTimeout

OUTCOMES: tuple[str, ...] = ("ok", "error", "timeout", "unknown", "malformed")

_abandoned: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@dataclass(frozen=True)
class ToolOutcome:
    """One call's result.

    name:    the tool called (``""`` for a malformed call).
    status:  one of :data:`OUTCOMES`.
    content: the observation text shown to the model (an ``Error: ...`` line unless ``status`` is ``ok``).
    seconds: how long the turn waited for it.
    abandoned: the call ran past its budget and its thread was left running (a ``timeout`` the tool did not end).
    """

    name: str
    status: str
    content: str
    seconds: float = 0.0
    abandoned: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_tool_calls(
    calls: ParsedTurn | Iterable[ToolCall | MalformedCall | str],
    tools: Mapping[str, Tool],
    timeout: float | None = None,
    *,
    max_calls: int | None = None,
) -> list[ToolOutcome]:
    """Run one turn's ``calls`` (a :class:`ParsedTurn`, or its items; a plain string is a malformed call's
    error) with ``tools`` by name; one :class:`ToolOutcome` per call, in order. Never raises for anything a
    call or a tool does. ``timeout`` caps every call's budget (seconds); ``max_calls`` caps how many calls of the
    turn are run (the rest get an ``error`` observation)."""
    items = list(calls.items if isinstance(calls, ParsedTurn) else calls)
    outcomes: list[ToolOutcome | None] = [None] * len(items)
    pending: list[tuple[int, _Running]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = MalformedCall(item)
        if isinstance(item, MalformedCall):
            outcomes[i] = ToolOutcome("", "malformed", f"Error: malformed tool call: {item.error}")
            continue
        if not isinstance(item, ToolCall):
            outcomes[i] = ToolOutcome("", "malformed", f"Error: malformed tool call: {type(item).__name__}")
            continue
        tool = tools.get(item.name)
        if tool is None:
            available = ", ".join(sorted(tools)) or "none"
            message = f"Error: unknown tool {item.name!r}; available tools: {available}"
            outcomes[i] = ToolOutcome(item.name, "unknown", message)
            continue
        if max_calls is not None and len(pending) >= max_calls:
            message = f"Error: too many tool calls in one turn (at most {max_calls})"
            outcomes[i] = ToolOutcome(item.name, "error", message)
            continue
        problem = _check(tool, item.arguments)
        if problem is not None:
            outcomes[i] = ToolOutcome(item.name, "error", f"Error: {item.name}: {problem}")
            continue
        budget = tool.timeout_s if timeout is None else min(tool.timeout_s, timeout)
        pending.append((i, _Running(tool, item, budget)))
    for i, running in pending:
        outcomes[i] = running.wait()
    return [o for o in outcomes if o is not None]


def count_outcomes(outcomes: Iterable[ToolOutcome]) -> dict[str, int]:
    """How many calls ended in each status (every status of :data:`OUTCOMES` present, zeros included)."""
    counts = Counter(o.status for o in outcomes)
    return {status: counts.get(status, 0) for status in OUTCOMES}


def failing_tools(outcomes: Iterable[ToolOutcome]) -> dict[str, list[ToolOutcome]]:
    """The tools none of whose calls in ``outcomes`` succeeded, each with its calls: every one ended ``error`` or
    ``timeout`` (a ``malformed`` call names no tool; an ``unknown`` one names a tool that is not there)."""
    calls: dict[str, list[ToolOutcome]] = {}
    for outcome in outcomes:
        if outcome.status in ("ok", "error", "timeout"):
            calls.setdefault(outcome.name, []).append(outcome)
    return {name: mine for name, mine in calls.items() if not any(o.ok for o in mine)}


def abandoned_calls() -> int:
    """Threads of calls past their budget that are still running (an in-process tool that hung)."""
    return sum(1 for t in list(_abandoned) if t.is_alive())


def _check(tool: Tool, arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, not {type(arguments).__name__}"
    try:
        return tool.check_arguments(arguments)
    except Exception as exc:  # noqa: BLE001 - a broken schema is the tool's error, not the turn's
        return f"could not check the arguments: {type(exc).__name__}: {exc}"


class _Running:
    """One call in its own daemon thread; :meth:`wait` returns its outcome by its deadline."""

    def __init__(self, tool: Tool, call: ToolCall, budget: float) -> None:
        self.tool, self.call, self.budget = tool, call, budget
        self.done = threading.Event()
        self.result: str | None = None
        self.error: BaseException | None = None
        self.start = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"rlzoo-tool-{call.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.tool.call(dict(self.call.arguments))
        except BaseException as exc:  # noqa: BLE001 - whatever the tool does, the turn goes on
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> ToolOutcome:
        name = self.call.name
        finished = self.done.wait(max(0.0, self.start + self.budget - time.monotonic()))
        seconds = time.monotonic() - self.start
        if not finished:
            _abandoned.add(self.thread)
            message = f"Error: {name} timed out after {self.budget:g} s"
            return ToolOutcome(name, "timeout", message, seconds, abandoned=True)
        if isinstance(self.error, ToolTimeout):
            return ToolOutcome(name, "timeout", f"Error: {name}: {self.error}", seconds)
        if isinstance(self.error, ToolError):
            return ToolOutcome(name, "error", f"Error: {name}: {self.error}", seconds)
        if self.error is not None:
            kind = type(self.error).__name__
            return ToolOutcome(name, "error", f"Error: {name} failed: {kind}: {self.error}", seconds)
        if not isinstance(self.result, str):
            kind = type(self.result).__name__
            return ToolOutcome(name, "error", f"Error: {name} returned {kind}, not text", seconds)
        return ToolOutcome(name, "ok", self.result, seconds)
