"""When a step's rollout batch is sampled, under which weights its old log-probs are computed, and how the rollout
engine receives the trained weights: :class:`RolloutSchedule`, the synchronous base; ``rollout.overlap: 1``'s
:class:`rlzoo.rl.overlap.OverlappedRollouts` and ``rollout.max_staleness``'s
:class:`rlzoo.rl.async_rollouts.AsyncRollouts` sample ahead of the trainer."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

from rlzoo.interfaces import Sample
from rlzoo.rl.learner import Learner
from rlzoo.rl.rollouts import RolloutBatch, RolloutParts, collect
from rlzoo.util.timer import Timer


class RolloutSchedule:
    """When a step's rollout batch is sampled and under which weights its old log-probs are computed.

    This base samples each batch at the start of its step (:func:`collect`), with the weights the step trains
    from, so nothing is in flight across steps. :class:`rlzoo.rl.overlap.OverlappedRollouts` (``rollout.overlap: 1``)
    samples step t+1's batch while step t trains."""

    def collect(self, step: int, prompts: Sequence[Sample], parts: RolloutParts, timer: Timer) -> RolloutBatch:
        """Step ``step``'s rollout batch (on rank 0, or on every rank with per-rank rollouts)."""
        return collect(step, prompts, parts, timer)

    def behaviour_weights(self) -> AbstractContextManager[None]:
        """Around the old-log-prob pass of the batch :meth:`collect` returned last: the training engine holds the
        weights that sampled it."""
        return nullcontext()

    def settle(self, timer: Timer, new_weights: bool = False) -> None:
        """Before a step returns: no generation is in flight; ``new_weights``: the rollout engine is about to
        receive the step's updated weights."""

    def publish(self, step: int, learner: Learner, parts: RolloutParts, updated: bool) -> None:
        """After step ``step`` (``updated``: its updates changed the weights): the rollout engine(s) of ``parts``
        (rank 0's, or with ``parts.per_rank`` every rank's) get the new weights, here at once
        (:meth:`Learner.push_weights`)."""
        if updated:
            learner.push_weights(parts.engine, every_rank=parts.per_rank)

    def paused(self) -> AbstractContextManager[None]:
        """Around an evaluation on the rollout engine: no batch is generated meanwhile, and the engine holds the
        trained weights."""
        return nullcontext()

    def close(self) -> None:
        """When the run ends (also by an error): wait for any generation still in flight."""
