"""Routing Replay inside one RL step: which routing each forward of the training engine replays, and the
MoE diagnostics logged for every MoE run whatever the router policy.

Per rollout batch (``source`` is the router policy's: ``none``, ``old`` = R2, ``rollout`` = R3):

    old-log-prob pass:  record the old policy's experts ("old routing")
                        R3: replay the rollout engine's experts instead (log-probs under the rollout's routing)
    reference routing:  none/old -> the old routing;  rollout -> the rollout engine's routing
    each update pass:   replay the reference rows of the minibatch (not for ``none``), and record the experts
                        the pass actually used

Metrics: ``moe/flip_rate`` — share of (token, layer, k) slots whose expert in the update pass differs from the
reference (0 under replay by construction, > 0 without it once weights move); ``moe/fresh_flip_rate`` — what
the current router would have chosen instead (the drift replay removed); ``moe/rollout_train_disagreement`` —
rollout vs training experts on the old weights, without replay; ``moe/rollout_train_disagreement_replayed`` —
the same on the replayed old pass (R3: 0); ``mismatch/abs_logp_diff_no_replay`` — the training engine's old
log-probs with fresh routing against the rollout's, next to ``mismatch/abs_logp_diff`` (with the policy's
routing); ``moe/replay_bytes`` — memory of the replayed indices.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch

from rlzoo.engines import Generation, LossFn, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import select_rows
from rlzoo.errors import RlzooError
from rlzoo.moe import Routing, find_routers, flip_rate, record_routing, replay_routing, routing_for_batch
from rlzoo.objective import masked_mean


class StepRouting:
    """The routing bookkeeping of one rollout batch for an MoE policy (build one per step)."""

    def __init__(self, trainer: TrainingEngine, source: str) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.source = source
        self.reference: Routing | None = None
        self.metrics: dict[str, float] = {}

    @staticmethod
    def applies_to(trainer: TrainingEngine) -> bool:
        return bool(find_routers(trainer.model))

    def old_logprobs(
        self, batch: TokenBatch, generations: list[Generation], rollout_logp: torch.Tensor
    ) -> torch.Tensor:
        with record_routing(self.model) as old_routing:
            fresh_logp = self.trainer.logprobs(batch)
        rollout_routing = None
        if all(g.routing is not None for g in generations):
            rollout_routing = routing_for_batch([g.routing for g in generations], batch, self.model)
            self.metrics["moe/rollout_train_disagreement"] = flip_rate(rollout_routing, old_routing, batch.attention_mask)
        if self.source == "rollout":
            if rollout_routing is None:
                raise RlzooError(
                    "router policy replay-rollout needs the rollout engine's routing; this rollout engine did not "
                    "record it (supported: rollout.engine {name: hf})"
                )
            with replay_routing(self.model, rollout_routing), record_routing(self.model) as used:
                logp = self.trainer.logprobs(batch)
            self.metrics["moe/rollout_train_disagreement_replayed"] = flip_rate(rollout_routing, used, batch.attention_mask)
            self.metrics["mismatch/abs_logp_diff_no_replay"] = masked_mean(
                (fresh_logp - rollout_logp).abs(), batch.response_mask
            ).item()
            self.reference = rollout_routing
            return logp
        self.reference = old_routing
        return fresh_logp

    def train_step(self, batch: TokenBatch, rows: torch.Tensor, loss_fn: LossFn) -> dict[str, float]:
        assert self.reference is not None, "old_logprobs() comes first"
        minibatch = select_rows(batch, rows)
        reference = self.reference.select(rows)
        with ExitStack() as stack:
            replay = stack.enter_context(replay_routing(self.model, reference)) if self.source != "none" else None
            used = stack.enter_context(record_routing(self.model))
            metrics = self.trainer.train_step(minibatch, loss_fn)
        metrics["moe/flip_rate"] = flip_rate(reference, used, minibatch.attention_mask)
        if replay is not None:
            metrics["moe/fresh_flip_rate"] = flip_rate(reference, replay.fresh, minibatch.attention_mask)
            metrics["moe/replay_bytes"] = float(self.reference.nbytes)
        return metrics


def routing_source(policy: Any) -> str:
    return getattr(policy, "source", "none") if policy is not None else "none"
