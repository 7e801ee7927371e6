"""The ``episode`` section of the run config: what an episode is (its environment, tools, tool parser and limits).
Part of :mod:`rlzoo.config.schema`, in its own module as :mod:`rlzoo.config.algorithm` is."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from rlzoo.config.base import DEFAULT_ENVIRONMENT, DEFAULT_TOOL_PARSER, Section, spec_class


class EpisodeConfig(Section):
    """What an episode is (:mod:`rlzoo.episodes.runner`): the environment that answers each turn, the tools it may call,
    and the limits. The default is one turn per episode, rlzoo's single-turn rollouts."""

    environment: spec_class("environment") = Field(
        default_factory=lambda: spec_class("environment")(name=DEFAULT_ENVIRONMENT),
        description="answers each policy turn with an observation or ends the episode",
    )
    tools: list[spec_class("tool")] = Field(default_factory=list, description="tools the episode's model may call")
    tool_parser: spec_class("tool_parser") | None = Field(
        None, description=f"finds tool calls in the model's text; null with tools: {{name: {DEFAULT_TOOL_PARSER}}}"
    )
    max_turns: int = Field(1, ge=1, description="policy turns per episode at most (each up to rollout.max_new_tokens)")
    max_tokens: int | None = Field(
        None,
        ge=2,
        description="token budget of one episode: prompt, every turn and every observation; a turn that would pass "
        "it is cut there and the episode ends, counted in episode/truncated; null: the model's context",
    )

    @field_validator("tools")
    @classmethod
    def _each_tool_once(cls, tools: list[Any]) -> list[Any]:
        # the environment finds a tool by its name: a second entry would silently replace the first
        first: dict[str, int] = {}
        for index, spec in enumerate(tools):
            if spec.name in first:
                message = (
                    f"tool {spec.name!r} is listed twice (first at episode.tools.{first[spec.name]}): calls "
                    "find a tool by its name, so only one entry could be used; list it once, with the "
                    "parameters you want"
                )
                # raised with its index so that the problem is reported at episode.tools.<index>
                error = InitErrorDetails(type=PydanticCustomError("duplicate_tool", message), loc=(index,), input=spec)
                raise ValidationError.from_exception_data("tools", [error])
            first[spec.name] = index
        return tools

    @model_validator(mode="after")
    def _default_parser(self) -> EpisodeConfig:
        if self.tool_parser is None and self.tools:
            self.tool_parser = spec_class("tool_parser")(name=DEFAULT_TOOL_PARSER)
        return self
