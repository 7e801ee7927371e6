"""The preflight's rules about prompts and episodes: chat prompts need a chat template, prompt, response and
episode fit the context (the model's, or the rollout engine's limit, ``RolloutEngine.context_tokens``), and the
policy's tokenizer can write a tool call.

Each rule is ``(RunFacts) -> problems``, run in order by :mod:`rlzoo.preflight.rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlzoo.episodes.prompts import context_limit, context_name
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.folder import ModelFolder
from rlzoo.models.tokenizer import char_vocab


def context_tokens(run: RunFacts) -> int | None:
    """The tokens a prompt and its response share: the smaller of the rollout engine's limit and the model's
    positions (:func:`rlzoo.episodes.prompts.context_limit`)."""
    return context_limit(_engine_limit(run), run.model.max_positions)


def _engine_limit(run: RunFacts) -> int | None:
    return run.rollout_engine.context_tokens() if run.rollout_engine is not None else None


def _context(run: RunFacts) -> str:
    """The context as a message names it: ``the 40-token context (rollout.engine.max_model_len)``."""
    engine = run.rollout_engine
    where = "model.tiny.max_position_embeddings" if run.model.tiny else "max_position_embeddings of model.path"
    return context_name(_engine_limit(run), run.model.max_positions, engine.context_option if engine else None, where)


def _context_field(run: RunFacts) -> str | None:
    """The field that sets the context when it is the rollout engine's limit (else ``None``: the model's)."""
    engine, limit = run.rollout_engine, _engine_limit(run)
    if limit is None or limit != context_tokens(run) or limit == run.model.max_positions:
        return None
    return f"rollout.engine.{engine.context_option or 'context'}"


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
        return [
            (
                "model.path",
                f"{why}, which need a tokenizer with a chat template, and the cold start's character "
                "tokenizer has none: set model.path to a model folder whose tokenizer has one, and "
                "cold_start.enabled: false",
            )
        ]
    return [
        (
            "model.path",
            f"{why}, which need a tokenizer with a chat template, and {config.model.path} has none (no "
            "chat_template.jinja, nor chat_template in tokenizer_config.json): use an instruct/chat model's folder"
            + ("" if chat_task else ", or prompt.plain: text"),
        )
    ]


def response_room_rule(run: RunFacts) -> list[Problem]:
    """``rollout.max_new_tokens`` leaves room for a prompt in the context."""
    context, new = context_tokens(run), run.config.rollout.max_new_tokens
    if context is None or new < context:
        return []
    field = _context_field(run)
    raise_it = f", or raise {field} above {new}" if field else ""
    return [
        (
            "rollout.max_new_tokens",
            f"{new} leaves no room for the prompt in {_context(run)}: a prompt and its response share it; use less "
            f"than {context}{raise_it}",
        )
    ]


def episode_rule(run: RunFacts) -> list[Problem]:
    """An episode's token budget fits the context and leaves room after the prompt; tools in chat prompts need a
    template that renders them."""
    episode, context, problems = run.config.episode, context_tokens(run), []
    if episode.max_tokens is not None and context is not None and episode.max_tokens > context:
        problems.append(
            (
                "episode.max_tokens",
                f"{episode.max_tokens} exceeds {_context(run)}; use at most {context}",
            )
        )
    prompt_limit = run.config.prompt.max_prompt_tokens
    if episode.max_tokens is not None and prompt_limit is not None and prompt_limit >= episode.max_tokens:
        problems.append(
            (
                "episode.max_tokens",
                f"{episode.max_tokens} leaves no room for a response after a prompt of up to prompt.max_prompt_tokens "
                f"{prompt_limit} tokens; use more than {prompt_limit}",
            )
        )
    if episode.tools and _chat(run) and run.model.chat_template_tools is False:
        problems.append(
            (
                "episode.tools",
                f"the chat template of {run.config.model.path} never reads `tools`, so the model would not see the tools' "
                "descriptions: use a model whose template supports tools (Qwen2.5/Qwen3, Hermes), or plain-text prompts "
                "(prompt.plain: text) whose cold start demonstrates the calls",
            )
        )
    return problems


def prompt_room_rule(run: RunFacts) -> list[Problem]:
    """``prompt.max_prompt_tokens + rollout.max_new_tokens`` fits the context."""
    p, new, context = run.config.prompt, run.config.rollout.max_new_tokens, context_tokens(run)
    if p.max_prompt_tokens is None or context is None or p.max_prompt_tokens + new <= context:
        return []
    return [
        (
            "prompt.max_prompt_tokens",
            f"{p.max_prompt_tokens} + rollout.max_new_tokens {new} exceeds {_context(run)}: use at most "
            f"{max(context - new, 0)}",
        )
    ]


def policy_vocab(run: RunFacts) -> tuple[dict[str, int] | None, str]:
    """The policy's token -> id map and where it comes from: a ``model.path`` folder's ``tokenizer.json``, or the
    character tokenizer a tiny policy is built on from the task's alphabet. ``None`` where it cannot be read here
    (no folder, as with ``--model-config``; no ``tokenizer.json``; a task whose data is missing: reported already)."""
    if run.config.model.path is not None:
        return ModelFolder(Path(run.config.model.path)).vocab()[0], f"the tokenizer.json of {run.config.model.path}"
    task = run.components.get("task")
    source = f"the tiny model's character tokenizer, built from the alphabet of task {run.config.task.name!r}"
    return (char_vocab(task.alphabet()) if task is not None and not task.check() else None), source


def tool_markup_rule(run: RunFacts) -> list[Problem]:
    """With an environment that calls tools, the policy's tokenizer can write every character of a call: the
    parser's declared markup (:attr:`rlzoo.interfaces.ToolCallParser.call_markup`) and each tool's name. Otherwise
    the model never makes a call and the run goes on with none."""
    environment, parser = run.components.get("episode.environment"), run.components.get("episode.tool_parser")
    if environment is None or parser is None or not environment.uses_tools or not parser.call_markup:
        return []
    vocab, source = policy_vocab(run)
    if vocab is None:
        return []
    names = [spec.name for spec in run.config.episode.tools]
    missing = sorted({char for char in parser.call_markup + "".join(names) if not _writable(char, vocab)})
    if not missing:
        return []
    return [
        (
            "episode.tool_parser",
            f"{parser.name!r} writes a call as {parser.call_markup} around the tool's name ({', '.join(names)}), but "
            f"the policy's tokenizer ({source}) cannot write {', '.join(map(repr, missing))}, so the model could never "
            "call a tool: use a task whose alphabet() holds them (calculator-arithmetic holds all printable ASCII), or "
            "a model.path whose tokenizer can write them",
        )
    ]


def _writable(char: str, vocab: Mapping[str, int]) -> bool:
    """Whether a tokenizer of ``vocab`` can write ``char``: as a token of its own, or byte by byte (SentencePiece's
    byte-fallback tokens ``<0xNN>``, or the byte characters of a byte-level BPE)."""
    raw = char.encode()
    return char in vocab or all(f"<0x{b:02X}>" in vocab for b in raw) or all(_BYTE_LEVEL[b] in vocab for b in raw)


def _byte_level() -> list[str]:
    """GPT-2's byte-to-character map of byte-level BPE (``bytes_to_unicode``): a printable byte is its own character,
    the others (space, newline, ...) are shifted past 255, in order (space is ``Ġ``)."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


_BYTE_LEVEL = _byte_level()
