"""Environments: what answers the policy between the turns of a multi-turn episode.

An episode is a loop (:mod:`rlzoo.episodes.runner`): the policy generates a turn, the environment reads its text and
answers with an :class:`Observation` (tool results, a user message) or ends the episode; the observation's tokens
are appended to the episode's one token sequence (in the context, out of the loss) and the policy generates the
next turn. The task's verifier scores the last turn's text; an environment may add a reward per turn, which the
``process`` advantage source receives as step rewards.

The default environment, ``single-turn``, ends every episode after its first turn: one response per sample, as
rlzoo has always sampled. References: verl ``verl/experimental/agent_loop/tool_agent_loop.py`` (generate, parse
tool calls, run tools, append the observation's tokens with mask 0, until no call or a limit); TRL's
environments (one stateful object per episode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rlzoo.interfaces.base import Component

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts
    from rlzoo.interfaces.task import Sample
    from rlzoo.interfaces.tool import Tool, ToolCallParser
    from rlzoo.tools import ToolOutcome


@dataclass
class Observation:
    """The environment's answer to one policy turn.

    messages:      what the model reads next, as chat messages (``{"role": "tool", "name": ..., "content": ...}``
                   for a tool's result, ``{"role": "user", "content": ...}`` for a user's reply). With chat prompts
                   the tokenizer's chat template renders them; with plain-text prompts
                   :meth:`Environment.plain_text` does. Ignored when ``done``.
    done:          the episode ends after this turn.
    reward:        this turn's reward (0 by default), added to the verifier's; a step reward for ``process``.
    tool_outcomes: the turn's tool calls as run (:class:`rlzoo.tools.ToolOutcome`), counted in ``tool/*``.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    tool_outcomes: Sequence[ToolOutcome] = ()


class Environment(Component):
    """``reset(sample) -> state`` starts an episode; ``step(state, sample, text) -> Observation`` answers a turn.

    ``state`` is the environment's own per-episode object (``None`` by default): the runner keeps one per episode
    and passes it back, so one environment object serves every episode of a batch, and :meth:`step` may be called
    for several episodes at once from worker threads (keep per-episode state in ``state``, never on ``self``).

    Capabilities (class attributes, read by the run's assembly; never probed):

    - ``uses_tools``: the environment calls the config's ``episode.tools`` through ``episode.tool_parser``; the
      run gives them to :meth:`use_tools` before the first episode. An environment without it refuses a config
      that names tools.
    - ``multi_turn``: an episode may have more than one turn; ``single-turn`` does not (its episodes are exactly
      the one-response rollouts, sampled ``group_size`` per prompt in one engine call).
    - ``gives_turn_rewards``: :attr:`Observation.reward` carries per-turn rewards; the ``process`` advantage then
      gets one step per turn (the verifier's reward on the last).
    """

    kind = "environment"
    metric_namespace = "env"
    uses_tools: ClassVar[bool] = False
    multi_turn: ClassVar[bool] = True
    gives_turn_rewards: ClassVar[bool] = False

    tools: Mapping[str, Tool] = {}
    parser: ToolCallParser | None = None

    def use_tools(self, tools: Mapping[str, Tool], parser: ToolCallParser) -> None:
        """The episode's tools by name and the parser of their calls (only for ``uses_tools``)."""
        self.tools, self.parser = dict(tools), parser

    def reset(self, sample: Sample) -> Any:
        """A new episode of ``sample``: the per-episode state later passed to :meth:`step`."""
        return None

    def step(self, state: Any, sample: Sample, text: str) -> Observation:
        """Answer the policy's turn ``text`` (decoded, special tokens removed)."""
        raise NotImplementedError

    def render_turn(self, turn: Mapping[str, Any]) -> str:
        """A demonstrated policy turn as the model writes it (the cold start's episodes): an assistant message
        ``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}``, the calls through the parser."""
        calls = turn.get("tool_calls") or []
        if not calls:
            return str(turn.get("content", ""))
        if self.parser is None:
            raise ValueError(f"environment {self.name!r} has no tool-call parser to write a demonstrated call with")
        from rlzoo.interfaces.tool import ToolCall

        written = [self.parser.format_call(ToolCall(c["name"], dict(c.get("arguments", {})))) for c in calls]
        return str(turn.get("content", "")) + "".join(written)

    def plain_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """How ``messages`` read in a plain-text (no chat template) episode: a tool message through the parser's
        ``format_result``, any other message's content as it is; each followed by a newline."""
        parts = []
        for message in messages:
            content = str(message.get("content", ""))
            if message.get("role") == "tool" and self.parser is not None:
                content = self.parser.format_result(str(message.get("name", "")), content)
            parts.append(content + "\n")
        return "".join(parts)

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """Tools configured for an environment that does not use them, or none for one that does."""
        episode = run.config.episode
        if episode.tools and not self.uses_tools:
            users = run.names("environment", lambda cls: cls.uses_tools)
            return [
                (
                    "episode.tools",
                    f"environment {self.name!r} calls no tools; use an environment that does "
                    f"({', '.join(users) or 'none is installed'}) or remove episode.tools",
                )
            ]
        if self.uses_tools and not episode.tools:
            return [
                (
                    "episode.tools",
                    f"environment {self.name!r} calls tools: name at least one, e.g. [{{name: calculator}}]",
                )
            ]
        if self.uses_tools and episode.max_turns == 1:
            return [
                (
                    "episode.max_turns",
                    f"1 ends every episode before a tool's result is read; use at least 2 with "
                    f"environment {self.name!r}",
                )
            ]
        if episode.max_turns > 1 and not self.multi_turn:
            return [
                (
                    "episode.max_turns",
                    f"{episode.max_turns}: environment {self.name!r} ends every episode after one turn; use 1",
                )
            ]
        return []
