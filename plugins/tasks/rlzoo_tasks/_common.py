"""Helpers shared by the tasks: seeded RNGs, drawing from finite pools, generated train/eval splits, data files
this user may read, prompt lengths at the preflight."""

from __future__ import annotations

import copy
import os
import random
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlzoo.interfaces import Sample

SPLITS = ("train", "eval")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")


def check_count(count: int | None) -> None:
    if count is not None and (not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be a non-negative integer or None, got {count!r}")


def rng_for(*parts: object) -> random.Random:
    """A private RNG seeded from a string: deterministic across processes and Python versions."""
    return random.Random(":".join(str(p) for p in parts))


def fresh(sample: Sample) -> Sample:
    """A copy the caller may mutate without changing the task's cached pools."""
    return Sample(
        sample.prompt,
        sample.answer,
        sample.demonstration,
        copy.deepcopy(sample.meta),
        copy.deepcopy(sample.messages),
        copy.deepcopy(sample.demonstration_turns),
    )


def take(pool: Sequence[Sample], count: int, rng: random.Random) -> list[Sample]:
    """``count`` samples from a finite pool in a seeded order; beyond the pool's size, further reshuffled passes."""
    if count > 0 and not pool:
        raise ValueError("cannot draw samples from an empty split")
    out: list[Sample] = []
    while len(out) < count:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order[: count - len(out)])
    return [fresh(s) for s in out]


# -- prompt length at the preflight ------------------------------------------------------------------------------

#: a data file up to this size is read by the preflight to measure its prompts; a larger one is not (its prompts are
#: measured when the run loads them: those too long for the model are dropped then, counted in the log)
MEASURE_BYTES = 16 * 2**20


def data_files(params: Any) -> list[tuple[str, str]]:
    """``(field, path)`` of a file-backed task's data: ``path``, and ``eval_path`` when it is given."""
    return [("path", params.path)] + ([("eval_path", params.eval_path)] if params.eval_path is not None else [])


def unreadable(path: Path) -> str | None:
    """Why this user may not read ``path``: a file it may not open (mode 000: only root's override reads it), a
    folder it may not list, or a parent folder it may not enter; nothing is read. ``None`` also when there is no
    such path (the caller says that in its own words)."""
    try:
        status = os.stat(path)
        if stat.S_ISDIR(status.st_mode):
            os.listdir(path)
        elif stat.S_ISREG(status.st_mode):
            with open(path, "rb"):
                pass
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        try:
            status = os.stat(path)
            mode = f" (mode {status.st_mode & 0o777:03o}, owner uid {status.st_uid})"
        except OSError:
            mode = ""
        return (
            f"{path}: {err.strerror or err}: this user (uid {os.geteuid()}) may not read it{mode}; give it read "
            "permission (chmod a+r), or run as a user who may read it"
        )
    return None


def char_budget(run: Any) -> tuple[int, int] | None:
    """``(most characters of a prompt, context tokens)`` when the preflight can count a plain prompt's tokens by its
    characters, else ``None``: the model is the cold start's (``model.path`` null), whose character tokenizer gives
    one token per character; prompts are plain text (``prompt.plain: text``); and ``prompt.max_prompt_tokens`` is
    not set (with it, longer prompts are dropped or truncated, and the preflight checks it against the context)."""
    config = run.config
    if config.model.path is not None or config.prompt.plain != "text" or config.prompt.max_prompt_tokens is not None:
        return None
    engine = run.rollout_engine
    limit = engine.context_tokens() if engine is not None else None
    context = limit if limit is not None else run.model.max_positions
    if context is None or config.rollout.max_new_tokens >= context:  # the latter: reported at rollout.max_new_tokens
        return None
    return context - config.rollout.max_new_tokens, context


def overlong_problem(lengths: Iterator[tuple[str, int]], run: Any) -> str | None:
    """The problem with the longest of ``(where, characters)`` prompts beyond :func:`char_budget`, or ``None``."""
    budget, context = char_budget(run)  # type: ignore[misc]
    over = [(n, where) for where, n in lengths if n > budget]
    if not over:
        return None
    longest, where = max(over, key=lambda item: item[0])
    more = f" ({len(over)} prompts of this file are longer than that)" if len(over) > 1 else ""
    return (
        f"{where}: a prompt of {longest:,} characters, one token each with the cold start's character tokenizer, "
        f"does not fit the model: its {context}-token context (model.tiny.max_position_embeddings or the rollout "
        f"engine's limit) leaves {budget} tokens beside rollout.max_new_tokens {run.config.rollout.max_new_tokens}"
        f"{more}; shorten or remove it, or set prompt.max_prompt_tokens (at most {budget}) to drop such prompts "
        "(with prompt.overlong_prompts: truncate, to keep their end)"
    )
