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

Several processes (:mod:`rlzoo.distributed`): each rank runs the old-log-prob pass on its share of the rows
(``Dist.share``) and the recorded routings are gathered, so every rank holds the whole batch's old and reference
routing; an update pass replays the rows of the rank's share of the minibatch (sliced from the reference exactly
like the minibatch), and the experts it used are gathered again so the flip rates are the whole minibatch's.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch

from rlzoo.distributed import SINGLE, Dist
from rlzoo.engines import Generation, LossFn, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import select_rows
from rlzoo.errors import RlzooError
from rlzoo.moe import Routing, find_routers, flip_rate, record_routing, replay_routing, routing_for_batch
from rlzoo.objective import masked_mean


class StepRouting:
    """The routing bookkeeping of one rollout batch for an MoE policy (build one per step)."""

    def __init__(self, trainer: TrainingEngine, source: str, dist: Dist = SINGLE) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.source = source
        self.dist = dist
        self.reference: Routing | None = None
        self.metrics: dict[str, float] = {}

    @staticmethod
    def applies_to(trainer: TrainingEngine) -> bool:
        return bool(find_routers(trainer.model))

    def old_logprobs(
        self, batch: TokenBatch, generations: list[Generation], rollout_logp: torch.Tensor
    ) -> torch.Tensor:
        count = batch.input_ids.shape[0]
        local = self.dist.share(torch.arange(count))
        local_batch = select_rows(batch, local) if self.dist.active else batch
        with record_routing(self.model) as old_routing:
            fresh_logp = self.trainer.logprobs(local_batch)
        fresh_logp, old_routing = self.dist.gather_rows(fresh_logp, count), self._gather(old_routing)
        rollout_routing = None
        if all(g.routing is not None for g in generations):
            rollout_routing = routing_for_batch([g.routing for g in generations], batch, self.model)
            self.metrics["moe/rollout_train_disagreement"] = flip_rate(rollout_routing, old_routing, batch.attention_mask)
        if self.source == "rollout":
            if rollout_routing is None:
                raise RlzooError(
                    "router policy replay-rollout needs the rollout engine's routing; this rollout engine did not "
                    "record it (supported: rollout.engine {name: hf} or {name: vllm})"
                )
            replayed = rollout_routing.select(local) if self.dist.active else rollout_routing
            with replay_routing(self.model, replayed), record_routing(self.model) as used:
                logp = self.trainer.logprobs(local_batch)
            logp, used = self.dist.gather_rows(logp, count), self._gather(used)
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
        local = self.dist.share(rows)  # this rank's rows of the minibatch (all of them in one process)
        minibatch = select_rows(batch, local)
        reference = self.reference.select(rows)
        local_reference = self.reference.select(local) if self.dist.active else reference
        with ExitStack() as stack:
            replay = stack.enter_context(replay_routing(self.model, local_reference)) if self.source != "none" else None
            used = stack.enter_context(record_routing(self.model))
            metrics = self.trainer.train_step(minibatch, loss_fn)
        attention = batch.attention_mask[rows] if self.dist.active else minibatch.attention_mask
        metrics["moe/flip_rate"] = flip_rate(reference, self._gather(used), attention)
        if replay is not None:
            metrics["moe/fresh_flip_rate"] = flip_rate(reference, self._gather(replay.fresh), attention)
            metrics["moe/replay_bytes"] = float(self.reference.nbytes)
        return metrics

    def _gather(self, routing: Routing) -> Routing:
        """Every rank's routing of its share, concatenated in rank order (the routing itself in one process)."""
        if not self.dist.active:
            return routing
        device = routing.indices.device
        return Routing.cat(self.dist.all_gather_object(routing.to("cpu"))).to(device)


def routing_source(policy: Any) -> str:
    return getattr(policy, "source", "none") if policy is not None else "none"
