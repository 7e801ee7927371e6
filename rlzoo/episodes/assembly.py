"""The run's episode runner assembled from the config: its environment, the tools it calls and their parser, its
token budget, and chat prompts that describe the tools to the model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlzoo.config.schema import RunConfig
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.interfaces import Environment, Tool


def with_tool_descriptions(config: RunConfig, tools: Mapping[str, Tool]) -> RunConfig:
    """``config`` whose chat prompts describe ``tools`` to the model: their schemas go to the chat template as
    ``tools=`` (plain-text prompts ignore them: their cold start demonstrates the calls)."""
    if not tools:
        return config
    schemas = [tool.schema() for tool in tools.values()]
    kwargs = {**config.prompt.chat_template_kwargs, "tools": schemas}
    return config.model_copy(update={"prompt": config.prompt.model_copy(update={"chat_template_kwargs": kwargs})})


def create_tools(config: RunConfig, registry: Any) -> dict[str, Tool]:
    """``episode.tools`` constructed, by name (the ``python`` tool probes its sandbox here: once per run)."""
    tools = (registry.create("tool", spec.name, spec.params) for spec in config.episode.tools)
    return {tool.name: tool for tool in tools}


def build_episode_runner(
    config: RunConfig, registry: Any, tokenizer: Any, context: int | None, tools: Mapping[str, Tool] | None = None
) -> EpisodeRunner:
    """The run's episode runner: its environment (given ``tools``, else ``episode.tools`` constructed, and the
    parser when it uses them), limits and the components' distributions (named in fault warnings); ``context`` is
    the model's (or rollout engine's) token limit, the budget when ``episode.max_tokens`` is null."""
    episode = config.episode
    environment: Environment = registry.create("environment", episode.environment.name, episode.environment.params)
    if environment.uses_tools:
        parser = registry.create("tool_parser", episode.tool_parser.name, episode.tool_parser.params)
        environment.use_tools(create_tools(config, registry) if tools is None else tools, parser)
    budget = episode.max_tokens or context
    if budget is None:
        budget = (config.prompt.max_prompt_tokens or 0) + episode.max_turns * config.rollout.max_new_tokens
    components = [("environment", episode.environment.name), *(("tool", spec.name) for spec in episode.tools)]
    distributions = {(kind, name): registry.get(kind, name).distribution for kind, name in components}
    return EpisodeRunner(environment, tokenizer, episode.max_turns, budget, distributions)
