"""Reproducible random streams: one seed per (run seed, step, purpose), and per rank.

A resumed run draws the same numbers as an uninterrupted one, because every seed is a function of the run's seed,
the step and a fixed stream number (the loop's streams: 0 the step's prompts, 1 its first generation batch, 2 the
minibatch shuffle, 3 evaluation, 100+ each minibatch's loss, 20,000+ / 30,000+ further generation batches'
prompts and sampling, 40,000 other ranks).
"""

from __future__ import annotations


def step_seed(seed: int, step: int, stream: int) -> int:
    """Independent, reproducible seeds per (run seed, step, purpose): a resumed run draws the same numbers."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


def rank_seed(seed: int, rank: int) -> int:
    """Rank ``rank``'s sampling seed for a generation batch seeded ``seed``: rank 0 keeps it (one process samples
    as it always did), the others get independent streams, so no two ranks draw correlated samples."""
    return seed if rank == 0 else step_seed(seed, rank, 40_000)
