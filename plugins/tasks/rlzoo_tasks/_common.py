"""Helpers shared by the tasks: seeded RNGs, drawing from finite pools, generated train/eval splits."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

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
        sample.prompt, sample.answer, sample.demonstration, copy.deepcopy(sample.meta), copy.deepcopy(sample.messages),
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
