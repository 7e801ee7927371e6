"""The ``tools`` environment: each policy turn's tool calls are run and their results are the next observation."""

from __future__ import annotations

from typing import Any

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Environment, Observation, Params, Sample
from rlzoo.tools import run_tool_calls


@rlzoo.register("environment", "tools")
class ToolCalling(Environment):
    """Run the tool calls of every turn and answer with their results; a turn without a call ends the episode.

    Each turn is parsed by ``episode.tool_parser``; its calls run concurrently under their time budgets
    (:func:`rlzoo.tools.run_tool_calls`) and every result, error included (a malformed call, an unknown tool, a
    tool that raised or timed out), becomes a ``tool`` message the model reads next. The episode's reward is the
    verifier's on the last turn (the answer). Reference: verl ``tool_agent_loop.py`` (the same loop: generate,
    parse, run, append the responses, until a turn calls nothing or a limit).
    """

    uses_tools = True
    reference = "verl ToolAgentLoop; TRL GRPOTrainer(tools=...)"
    verl_name = "tool_agent"

    class Params(Params):
        max_calls_per_turn: int = Field(4, ge=1, description="calls run per turn; later ones get an error observation")
        timeout_s: float | None = Field(
            None, gt=0, description="caps every call's time budget (each tool's own timeout_s otherwise)"
        )

    def step(self, state: Any, sample: Sample, text: str) -> Observation:
        parsed = self.parser.parse(text)
        if not parsed.has_calls:
            return Observation(done=True)
        outcomes = run_tool_calls(parsed, self.tools, self.params.timeout_s, max_calls=self.params.max_calls_per_turn)
        messages = [{"role": "tool", "name": o.name, "content": o.content} for o in outcomes]
        return Observation(messages=messages, tool_outcomes=outcomes)
