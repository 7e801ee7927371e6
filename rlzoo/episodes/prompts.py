"""Prompt token ids for a sample: the one encoding that rollout, training, evaluation and the cold start share.

:func:`prompt_ids` is the only place a :class:`~rlzoo.interfaces.Sample` becomes prompt tokens:

- chat messages (``Sample.messages``, and plain prompts when ``prompt.plain`` is ``chat``) are rendered by the
  tokenizer's own chat template, ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
  **prompt.chat_template_kwargs)``, and the text is tokenized with ``add_special_tokens=False`` (the template
  writes its special tokens itself), as verl's ``RLHFDataset`` does; ``prompt.system`` is put first when the
  messages have no system message;
- plain prompts (``prompt.plain: text``) are tokenized as they are, ``add_special_tokens=False``.

Length (``prompt.max_prompt_tokens``): :func:`fit_prompts` drops the longer prompts from a split, or with
``overlong_prompts: truncate`` keeps them and :func:`prompt_ids` keeps their *last* tokens (so a chat prompt keeps
its generation prompt); either way the count is logged, never cut silently. Without it, a prompt longer than the
context leaves beside the response (:func:`prompt_budget`) is dropped, counted in the log the same way. The context
(:func:`context_limit`) is the smaller of the rollout engine's limit and the model's positions, so a prompt + its
``rollout.max_new_tokens`` always fit what the engine accepts, and no response is cut short by the context.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from rlzoo.config.schema import PromptConfig
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Sample

log = logging.getLogger("rlzoo.episodes.prompts")


def chat_messages(sample: Sample, config: PromptConfig) -> list[dict[str, str]] | None:
    """The messages the chat template renders for ``sample``, or ``None`` when it is encoded as plain text."""
    if sample.messages is not None:
        messages = list(sample.messages)
    elif config.plain == "chat":
        messages = [{"role": "user", "content": sample.prompt}]
    else:
        return None
    if config.system is not None and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": config.system})
    return messages


def full_prompt_ids(tokenizer: Any, sample: Sample, config: PromptConfig) -> list[int]:
    """The prompt's token ids before any truncation."""
    messages = chat_messages(sample, config)
    if messages is None:
        return list(tokenizer(sample.prompt, add_special_tokens=False)["input_ids"])
    if not tokenizer.chat_template:  # None when the model folder ships no template
        raise RlzooError(
            "prompts given as chat messages (or prompt.plain: chat / prompt.system) need a tokenizer with a chat "
            "template, and this one has none: set model.path to a model folder whose tokenizer has one (e.g. an "
            "instruct model), or use plain-string prompts with prompt.plain: text"
        )
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **config.chat_template_kwargs
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer: Any, sample: Sample, config: PromptConfig) -> list[int]:
    """The token ids of ``sample``'s prompt, as every stage of a run sees them."""
    ids = full_prompt_ids(tokenizer, sample, config)
    limit = config.max_prompt_tokens
    if limit is None or len(ids) <= limit:
        return ids
    if config.overlong_prompts == "truncate":
        return ids[-limit:]
    raise RlzooError(
        f"a prompt of {len(ids)} tokens exceeds prompt.max_prompt_tokens={limit} but was not dropped: filter the "
        "split with rlzoo.episodes.prompts.fit_prompts first"
    )


def context_limit(engine: int | None, positions: int | None) -> int | None:
    """The tokens a prompt and its response share: the smaller of the rollout engine's limit
    (:meth:`rlzoo.engines.RolloutEngine.context_tokens`, e.g. vLLM's ``max_model_len``) and the model's
    ``max_position_embeddings``; ``None`` when neither is known."""
    known = [n for n in (engine, positions) if n is not None]
    return min(known) if known else None


def context_name(
    engine: int | None,
    positions: int | None,
    option: str | None,
    where: str = "the model's max_position_embeddings",
) -> str:
    """What sets :func:`context_limit`, as a message names it: ``the 40-token context (rollout.engine.max_model_len)``
    (``option``: the engine's :attr:`~rlzoo.engines.RolloutEngine.context_option`) or ``the 2048-token context (the
    model's max_position_embeddings)`` (``where``: the field that holds the positions)."""
    context = context_limit(engine, positions)
    if engine is not None and context == engine and engine != positions:
        return f"the {engine}-token context (rollout.engine.{option or 'context'})"
    return f"the {context}-token context ({where})"


def prompt_budget(context: int | None, max_new_tokens: int) -> int | None:
    """The most prompt tokens a ``context``-token model leaves beside a response of ``max_new_tokens``
    (``rollout.max_new_tokens``); ``None`` when the context is unknown."""
    return None if context is None else max(context - max_new_tokens, 0)


def _longer_than(tokenizer: Any, sample: Sample, config: PromptConfig, limit: int) -> bool:
    if sample.messages is None and config.plain == "text" and 2 * len(sample.prompt.encode()) + 8 <= limit:
        return False  # no tokenizer in use gives a plain text more tokens than UTF-8 bytes (+1): skip encoding it
    return len(full_prompt_ids(tokenizer, sample, config)) > limit


def fit_prompts(
    samples: Sequence[Sample],
    tokenizer: Any,
    config: PromptConfig,
    split: str,
    budget: int | None = None,
    context: str = "the model's context",
) -> list[Sample]:
    """``samples`` with the prompts longer than ``prompt.max_prompt_tokens`` dropped (or kept, to be truncated by
    :func:`prompt_ids`); how many were dropped or truncated is logged. Raises when no prompt is left.

    Without ``max_prompt_tokens``, ``budget`` (:func:`prompt_budget`: what the context leaves beside the response;
    ``context`` names it, :func:`context_name`) still bounds them: a longer prompt could not be run with a whole
    response, so it is dropped, counted in the log."""
    limit = config.max_prompt_tokens
    if limit is None:
        if budget is None:
            return list(samples)
        kept = [s for s in samples if not _longer_than(tokenizer, s, config, budget)]
        if len(kept) < len(samples):
            log.warning(
                "%s split: %d of %d prompts are longer than the %d tokens %s leaves beside rollout.max_new_tokens "
                "and are dropped (set prompt.max_prompt_tokens to choose how long prompts are dropped or truncated)",
                split,
                len(samples) - len(kept),
                len(samples),
                budget,
                context,
            )
        if samples and not kept:
            raise RlzooError(
                f"every prompt of the {split} split is longer than the {budget} tokens {context} leaves beside "
                "rollout.max_new_tokens: raise the context (a model with a longer one, or the rollout engine's "
                "limit), lower rollout.max_new_tokens, use shorter prompts, or set prompt.max_prompt_tokens with "
                "prompt.overlong_prompts: truncate"
            )
        return kept
    kept, overlong = [], 0
    for sample in samples:
        if len(full_prompt_ids(tokenizer, sample, config)) > limit:
            overlong += 1
            if config.overlong_prompts == "drop":
                continue
        kept.append(sample)
    if overlong:
        action = "dropped" if config.overlong_prompts == "drop" else "truncated to their last tokens"
        log.warning(
            "%s split: %d of %d prompts are longer than prompt.max_prompt_tokens=%d and are %s",
            split,
            overlong,
            len(samples),
            limit,
            action,
        )
    if samples and not kept:
        raise RlzooError(
            f"every prompt of the {split} split is longer than prompt.max_prompt_tokens={limit}: raise it, or set "
            "prompt.overlong_prompts: truncate"
        )
    return kept
