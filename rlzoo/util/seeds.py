"""Reproducible random streams: one seed per (run seed, step, purpose), and per rank.

A resumed run draws the same numbers as an uninterrupted one, because every seed is a function of the run's seed,
the step and a fixed stream number, named once in :class:`Stream`. The numbers are part of every fixed-seed run's
results: changing one changes what such a run samples.
"""

from __future__ import annotations

from enum import IntEnum


class Stream(IntEnum):
    """The random streams of a run, by purpose; a purpose drawn several times per step adds its index to its base."""

    PROMPTS = 0  # the step's prompts
    FIRST_GENERATION = 1  # the step's first generation batch (sampling)
    SHUFFLE = 2  # the minibatch shuffle
    EVAL = 3  # evaluation's sampling (step 0: every evaluation sees the same stream)
    MINIBATCH_LOSS = 100  # + minibatch index: components of the loss that draw at random (e.g. clip-cov)
    FRESH_PROMPTS = 20_000  # + generation batch: a batch filter's further generation batches' prompts
    GENERATION = 30_000  # + generation batch: their sampling
    RANK = 40_000  # the other ranks' sampling (rank_seed)
    GRADIENT_SKETCH = 50_000  # rlzoo mismatch's random projection of gradients (step 0: one map per config seed)


def step_seed(seed: int, step: int, stream: int) -> int:
    """Independent, reproducible seeds per (run seed, step, purpose): a resumed run draws the same numbers."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


def generation_seed(seed: int, step: int, gen_batch: int) -> int:
    """The sampling seed of generation batch ``gen_batch`` of step ``step`` (the first its own stream)."""
    if gen_batch == 0:
        return step_seed(seed, step, Stream.FIRST_GENERATION)
    return step_seed(seed, step, Stream.GENERATION + gen_batch)


def rank_seed(seed: int, rank: int) -> int:
    """Rank ``rank``'s sampling seed for a generation batch seeded ``seed``: rank 0 keeps it (one process samples
    as it always did), the others get independent streams, so no two ranks draw correlated samples."""
    return seed if rank == 0 else step_seed(seed, rank, Stream.RANK)
