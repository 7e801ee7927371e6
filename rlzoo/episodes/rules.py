"""The preflight's rules about prompts and episodes: chat prompts need a chat template, and prompt, response and
episode fit the context (the model's, or the rollout engine's limit, ``RolloutEngine.context_tokens``).

Each rule is ``(RunFacts) -> problems``, run in order by :mod:`rlzoo.preflight.rules`.
"""

from __future__ import annotations

from rlzoo.interfaces import Problem, RunFacts


def context_tokens(run: RunFacts) -> int | None:
    """The tokens a prompt and its response share: the rollout engine's limit, else the model's positions."""
    limit = run.rollout_engine.context_tokens() if run.rollout_engine is not None else None
    return limit if limit is not None else run.model.max_positions


def _chat_task(run: RunFacts) -> bool:
    """Whether the task gives chat messages (a task that failed to construct is reported already)."""
    task = run.components.get("task")
    return task is not None and task.chat_prompts()


def _chat(run: RunFacts) -> bool:
    """Whether prompts are rendered with the chat template: a task giving chat messages, or ``prompt.plain: chat``."""
    return _chat_task(run) or run.config.prompt.plain == "chat"


def chat_template_rule(run: RunFacts) -> list[Problem]:
    """Chat prompts need a tokenizer with a chat template."""
    config = run.config
    if not _chat(run) or run.model.chat_template is not False:
        return []
    chat_task = _chat_task(run)
    why = f"task {config.task.name!r} gives chat messages" if chat_task else "prompt.plain is 'chat'"
    if config.model.path is None:
        return [("model.path", f"{why}, which need a tokenizer with a chat template, and the cold start's character "
                 "tokenizer has none: set model.path to a model folder whose tokenizer has one, and "
                 "cold_start.enabled: false")]
    return [("model.path", f"{why}, which need a tokenizer with a chat template, and {config.model.path} has none (no "
             "chat_template.jinja, nor chat_template in tokenizer_config.json): use an instruct/chat model's folder"
             + ("" if chat_task else ", or prompt.plain: text"))]


def response_room_rule(run: RunFacts) -> list[Problem]:
    """``rollout.max_new_tokens`` leaves room for a prompt in the context."""
    context, new = context_tokens(run), run.config.rollout.max_new_tokens
    if context is None or new < context:
        return []
    return [(
        "rollout.max_new_tokens",
        f"{new} leaves no room for the prompt in the {context}-token context (the model's max_position_embeddings or "
        f"the rollout engine's limit); use less than {context}",
    )]


def episode_rule(run: RunFacts) -> list[Problem]:
    """An episode's token budget fits the context and leaves room after the prompt; tools in chat prompts need a
    template that renders them."""
    episode, context, problems = run.config.episode, context_tokens(run), []
    if episode.max_tokens is not None and context is not None and episode.max_tokens > context:
        problems.append((
            "episode.max_tokens",
            f"{episode.max_tokens} exceeds the {context}-token context (the model's max_position_embeddings or the "
            f"rollout engine's limit); use at most {context}",
        ))
    prompt_limit = run.config.prompt.max_prompt_tokens
    if episode.max_tokens is not None and prompt_limit is not None and prompt_limit >= episode.max_tokens:
        problems.append((
            "episode.max_tokens",
            f"{episode.max_tokens} leaves no room for a response after a prompt of up to prompt.max_prompt_tokens "
            f"{prompt_limit} tokens; use more than {prompt_limit}",
        ))
    if episode.tools and _chat(run) and run.model.chat_template_tools is False:
        problems.append((
            "episode.tools",
            f"the chat template of {run.config.model.path} never reads `tools`, so the model would not see the tools' "
            "descriptions: use a model whose template supports tools (Qwen2.5/Qwen3, Hermes), or plain-text prompts "
            "(prompt.plain: text) whose cold start demonstrates the calls",
        ))
    return problems


def prompt_room_rule(run: RunFacts) -> list[Problem]:
    """``prompt.max_prompt_tokens + rollout.max_new_tokens`` fits the context."""
    p, new, context = run.config.prompt, run.config.rollout.max_new_tokens, context_tokens(run)
    if p.max_prompt_tokens is None or context is None or p.max_prompt_tokens + new <= context:
        return []
    return [(
        "prompt.max_prompt_tokens",
        f"{p.max_prompt_tokens} + rollout.max_new_tokens {new} exceeds the {context}-token context (the model's "
        f"max_position_embeddings or the rollout engine's limit): use at most {max(context - new, 0)}",
    )]
