"""``rollout.overlap: 1``: sample step t+1's rollout batch while step t trains, and compute its old log-probs
under the weights that sampled it.

With ``w_t`` the training engine's weights at the start of step t (what the rollout engine holds during step t)::

    step t:  batch t      <- prefetched during step t-1 (sampled by w_{t-1}); the first batch of a run (or of a
                             resumed run) is sampled now, by w_t
             background   <- start sampling and scoring batch t+1 on the rollout engine (w_t)
             old logp     <- the training engine with the weights that sampled batch t swapped in, then w_t back
             updates      :  w_t -> w_{t+1}
             wait for batch t+1 (time/prefetch_wait); rollout engine <- w_{t+1}

Staleness 1: batch t+1 is sampled by ``w_t`` and trained from ``w_{t+1}``. The ratio corrects it like any
off-policy minibatch (design.md §1): its denominator, the old log-probs ``old_{i,t}``, are those of the sampling
weights ``w_t``, so ``exp(logp - old)`` is the importance weight of the current policy against the behaviour
policy, one optimizer step further off-policy than without overlap; the clipper bounds it as usual. With
``algorithm.old_logprobs: rollout`` the rollout engine's log-probs are of ``w_t`` by construction; the training
engine's pass (mismatch metrics, corrections such as TIS, the MoE routing that Routing Replay R2 replays, and
``policy/entropy``) also runs under ``w_t``. The KL reference is untouched.

How the sampling weights come back: the training engine's own weights are exchanged with a copy of ``w_t`` for the
old-log-prob pass (:meth:`OverlappedRollouts.behaviour_weights`, through the engine's ``copy_weights`` /
``exchange_weights`` / ``restore_weights``), so the learner, the router policy's record/replay and the row split
run unchanged on the same engine. Memory: one extra copy of the policy's
parameters (no optimizer state, no gradients) on the training engine's device, plus one parameter tensor while
exchanging. The alternative, a frozen second training engine loaded with ``w_t`` like the KL reference, would
cost a whole engine and record Routing Replay's routing on another module.

Time: generation runs in a thread of this process. Torch releases the GIL in its kernels, so the rollout engine
(``hf``: transformers ``generate`` on its own copy of the policy; ``vllm``: the engine core runs in this process)
and the trainer run at once, but they share the machine's cores: on a few CPU cores each phase slows down and the
step may gain nothing (docs/overlap.md). ``time/rollout`` and ``time/verify`` of a
prefetched batch are the background thread's durations (so with overlap the ``time/*`` sum exceeds the step);
``time/prefetch_wait`` is what the step spent waiting for the next batch before the weight sync;
``rollout/staleness`` is the number of weight syncs between the sampling weights and the trained ones (0 or 1).

Limits (checked by :mod:`rlzoo.rl.overlap_rules`): one process (with a launcher rank 0 samples while the other ranks wait
at collectives; the prefetch would reorder them), and a training engine whose ``model`` parameters are the full
weights (the DeepSpeed engine's own check refuses ZeRO-3). The hf engine seeds sampling through torch's global generator, so a training
component drawing from it while the batch is sampled would change the sampled tokens (none of rlzoo's does).
Resume: the prefetched batch is not checkpointed; a resumed run samples its first batch with the checkpoint's
weights (staleness 0), so from that step on its metrics differ from an uninterrupted run's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlzoo.engines import TrainingEngine
from rlzoo.interfaces import Sample
from rlzoo.rl.rollouts import RolloutBatch, RolloutParts, collect
from rlzoo.rl.schedule import RolloutSchedule
from rlzoo.util.timer import Timer


@dataclass
class _Prefetch:
    """One batch being sampled in the background, and the weights version sampling it."""

    step: int
    version: int
    timer: Timer = field(default_factory=Timer)
    batch: RolloutBatch | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None


class OverlappedRollouts(RolloutSchedule):
    """Samples step t+1's batch in a background thread while step t trains; old log-probs under the sampling weights.

    ``engine`` is the training engine (it copies and exchanges its weights); ``prompts_for(step)`` the
    prompts of a step (as the run driver draws them); ``steps`` the run's last step + 1 (nothing is prefetched
    beyond it). Versions count weight syncs: the rollout engine holds version ``version``; ``versions[step]`` is
    the version that sampled step ``step``'s batch.
    """

    def __init__(self, engine: TrainingEngine, prompts_for: Callable[[int], Sequence[Sample]], steps: int) -> None:
        self.engine = engine
        self.prompts_for = prompts_for
        self.steps = steps
        self.version = 0
        self.versions: dict[int, int] = {}
        self.batch_version = 0  # the version that sampled the batch collect() returned last
        self.snapshot: Any = None  # the engine's copy of the weights of version `snapshot_version`
        self.snapshot_version = -1
        self.pending: _Prefetch | None = None

    # -- the batches ----------------------------------------------------------------------------------------------

    def collect(self, step: int, prompts: Sequence[Sample], parts: RolloutParts, timer: Timer) -> RolloutBatch:
        if self.pending is not None and self.pending.step == step:
            prefetch, self.pending = self.pending, None
            # done already: settle() waited for it at the end of the previous step
            batch, version = self._join(prefetch), prefetch.version
            for name, seconds in prefetch.timer.seconds.items():  # the background phases, as if sampled now
                timer.seconds[name] += seconds
        else:  # the run's (or the resumed run's) first batch; nothing in flight (settle() ran after every step)
            batch, version = collect(step, prompts, parts, timer), self.version
        self.versions[step] = self.batch_version = version
        batch.metrics["rollout/staleness"] = float(self.version - version)
        if step + 1 < self.steps:
            self._launch(step + 1, parts)
        return batch

    def _launch(self, step: int, parts: RolloutParts) -> None:
        prefetch = _Prefetch(step, self.version)
        prompts = self.prompts_for(step)

        def sample() -> None:
            try:
                prefetch.batch = collect(step, prompts, parts, prefetch.timer)
            except BaseException as error:  # re-raised in the main thread by settle()
                prefetch.error = error

        prefetch.thread = threading.Thread(target=sample, name=f"rlzoo-prefetch-step-{step}", daemon=True)
        prefetch.thread.start()
        self.pending = prefetch

    def settle(self, timer: Timer, new_weights: bool = False) -> None:
        if self.pending is not None:
            with timer("prefetch_wait"):  # 0 when the batch was ready before the step's updates ended
                self._join(self.pending)
        if new_weights:
            self.version += 1

    def close(self) -> None:
        if self.pending is not None and self.pending.thread is not None:
            self.pending.thread.join()
            self.pending = None

    @staticmethod
    def _join(prefetch: _Prefetch) -> RolloutBatch:
        """Wait for ``prefetch``'s thread; its batch, or what the thread raised, raised here."""
        if prefetch.thread is not None:  # None only between _Prefetch() and its start in _launch
            prefetch.thread.join()
        if prefetch.error is not None:
            raise prefetch.error
        if prefetch.batch is None:
            raise RuntimeError(f"overlap: the prefetch of step {prefetch.step} ended with neither a batch nor an error")
        return prefetch.batch

    # -- the behaviour weights ------------------------------------------------------------------------------------

    @contextmanager
    def behaviour_weights(self) -> Iterator[None]:
        """The sampling weights in the training engine during the block; afterwards the trainer's own weights, and
        the snapshot holds them (they are what the rollout engine is sampling the next batch with)."""
        stale = self.batch_version != self.version
        if stale:
            if self.snapshot_version != self.batch_version or self.batch_version != self.version - 1:
                raise RuntimeError(
                    f"overlap: the batch was sampled by weights version {self.batch_version}, the snapshot holds "
                    f"{self.snapshot_version} and the trainer {self.version}; staleness above 1 is not supported"
                )
            self.engine.exchange_weights(self.snapshot)
        try:
            yield
        finally:
            if stale:  # the snapshot holds the trainer's weights since the exchange: put them back
                self.engine.restore_weights(self.snapshot)
            else:
                self.snapshot = self.engine.copy_weights(into=self.snapshot)
            self.snapshot_version = self.version
