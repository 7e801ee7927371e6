"""``relay-trainer``: plain torch training that counts the core's calls of the engine contract's policy methods.

Each :meth:`train_step` reports the running counts as metrics: ``relay/routing_passes`` (MoE Routing Replay's
record/replay passes, :meth:`routing_pass`) and ``relay/weight_copies`` (``rollout.overlap: 1``'s
:meth:`copy_weights` / :meth:`exchange_weights` / :meth:`restore_weights`), so a test can see that the core went
through the engine rather than around it.
"""

from __future__ import annotations

from collections import Counter

from rlzoo.engines import LossFn, TokenBatch, TorchTrainingEngine


class RelayTrainingEngine(TorchTrainingEngine):
    """Plain torch AdamW that counts Routing Replay passes and weight copies (relay/* metrics)."""

    name = "relay-trainer"

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.calls: Counter[str] = Counter()

    def routing_pass(self, replay=None):
        self.calls["routing_passes"] += 1
        return super().routing_pass(replay)

    def copy_weights(self, into=None):
        self.calls["weight_copies"] += 1
        return super().copy_weights(into)

    def exchange_weights(self, copy) -> None:
        self.calls["weight_copies"] += 1
        super().exchange_weights(copy)

    def restore_weights(self, copy) -> None:
        self.calls["weight_copies"] += 1
        super().restore_weights(copy)

    def train_step(self, batch: TokenBatch, loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        metrics = super().train_step(batch, loss_fn, with_entropy)
        counts = {f"relay/{key}": float(self.calls[key]) for key in ("routing_passes", "weight_copies")}
        return {**metrics, **counts}
