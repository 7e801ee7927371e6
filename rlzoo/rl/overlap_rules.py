"""The preflight's rule about :mod:`rlzoo.rl.overlap`: ``rollout.overlap: 1`` runs in one process only (a training
engine that cannot exchange its weights says so in its own check)."""

from __future__ import annotations

from rlzoo.interfaces import Problem, RunFacts


def overlap_rule(run: RunFacts) -> list[Problem]:
    """Sampling the next batch during the update needs a run of one process."""
    if run.config.rollout.overlap == 0 or run.world <= 1:
        return []
    return [
        (
            "rollout.overlap",
            f"1 runs in one process only; this run has {run.world} (rank 0 would sample the next batch while the "
            "ranks meet at the update's collectives): use rollout.overlap: 0 with several processes",
        )
    ]
