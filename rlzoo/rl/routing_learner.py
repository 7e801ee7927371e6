"""The learner of an MoE policy: the router policy's Routing Replay around the learner's forward passes within one
RL step, and the MoE diagnostics logged for every MoE run whatever the policy (the mechanics of recording and
replaying experts on a model are :mod:`rlzoo.moe.record` and :mod:`rlzoo.moe.replay`).

Per rollout batch:

    old-log-prob pass:  the policy's ``old_pass_routing`` (R3: the rollout engine's experts) is replayed, or the
                        pass routes afresh; the experts it used become ``RecordedRouting.old``
    each update pass:   the policy's ``update_routing`` (a routing over all MoE layers, some, or none) is
                        replayed for the minibatch's rows; the experts the pass used are recorded

Metrics: ``moe/flip_rate`` — share of (token, layer, k) slots whose expert in the update pass differs from the
reference (per layer: the replayed routing where the policy replays that layer, else the old pass's experts;
0 under replay by construction, > 0 without it once the weights move); ``moe/flip_rate/layer_N`` — the same per
MoE layer; ``moe/fresh_flip_rate`` — what the current router would have chosen instead in the replayed layers
(the drift replay removed); ``moe/rollout_train_disagreement`` — rollout vs training experts on the old weights,
routing afresh; ``moe/rollout_train_disagreement_replayed`` — the same on a replayed old pass (R3: 0);
``mismatch/abs_logp_diff_no_replay`` — the old log-probs with fresh routing against the rollout's, next to
``mismatch/abs_logp_diff`` (with the policy's routing); ``moe/replay_bytes`` — memory of the replayed indices.

Several processes: each rank runs its share of the rows (``Dist.share``) and the recorded routings are
gathered, so every rank holds the whole batch's routings; an update pass replays the rows of the rank's share of
the minibatch, and the experts it used are gathered again so the flip rates are the whole minibatch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlzoo.engines import GradientRequest, LossFn, TokenBatch, TrainingEngine
from rlzoo.errors import RlzooError
from rlzoo.interfaces import RecordedRouting, RouterPolicy
from rlzoo.interfaces.base import collecting
from rlzoo.moe import Layout, Routing, flip_counts, routing_for_batch
from rlzoo.rl.learner import Learner
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.tensors import masked_mean


class RoutingLearner(Learner):
    """A learner for an MoE policy: replays what the router policy chooses and measures expert flips."""

    def __init__(self, engine: TrainingEngine, policy: RouterPolicy, dist: Dist = SINGLE) -> None:
        super().__init__(engine, dist)
        self.policy = policy
        layout = engine.moe_layout()
        if layout is None:
            raise RlzooError(f"router policy {policy.name!r} needs a mixture-of-experts policy; this one is dense")
        self.layout: Layout = layout
        self.recorded = RecordedRouting(old=None, rollout=None)
        self.replayed: Routing | None = None
        self.metrics: dict[str, float] = {}

    def old_logprobs(
        self, batch: TokenBatch, rollout_logp: torch.Tensor, rollout_routing: list[torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.metrics = {}
        with collecting() as reports:  # the router policy's (the engine's passes collect their own)
            logp, entropy = self._old_pass(batch, rollout_logp, rollout_routing)
        self.metrics.update(reports)
        return logp, entropy

    def _old_pass(
        self, batch: TokenBatch, rollout_logp: torch.Tensor, rollout_routing: list[torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rollout = self._rollout_routing(batch, rollout_routing)
        with self._recording(batch) as fresh:
            logp, entropy = self.logprobs_and_entropy(batch)
        old = fresh.routing
        if rollout is not None:
            self.metrics["moe/rollout_train_disagreement"] = _rate(flip_counts(rollout, old, batch.attention_mask))
        replay_old = self.policy.old_pass_routing(RecordedRouting(old=None, rollout=rollout))
        if replay_old is not None:  # R3: the old log-probs under the rollout's experts
            fresh_logp = logp
            with self._recording(batch, replay=replay_old) as used:
                logp, entropy = self.logprobs_and_entropy(batch)
            old = used.routing
            self.metrics["mismatch/abs_logp_diff_no_replay"] = masked_mean(
                (fresh_logp - rollout_logp).abs(), batch.response_mask
            ).item()
            if rollout is not None:
                replayed = _rate(flip_counts(rollout, old, batch.attention_mask))
                self.metrics["moe/rollout_train_disagreement_replayed"] = replayed
        self.recorded = RecordedRouting(old=old, rollout=rollout)
        self.replayed = self.policy.update_routing(self.recorded)
        return logp, entropy

    def without_old_pass(self, batch: TokenBatch, rollout_routing: list[torch.Tensor | None]) -> None:
        """No old pass: the policy decides from the rollout's experts alone (``recorded.old`` is ``None``), and
        the flip rates of layers routed afresh have no reference, so only replayed layers report them."""
        self.metrics = {}
        with collecting(into=self.metrics):  # the router policy's
            if self.policy.needs_old_pass():
                raise RlzooError(f"router policy {self.policy.name!r} replays the old pass, which this run skips")
            self.recorded = RecordedRouting(old=None, rollout=self._rollout_routing(batch, rollout_routing))
            self.replayed = self.policy.update_routing(self.recorded)

    def _rollout_routing(self, batch: TokenBatch, rollout_routing: list[torch.Tensor | None]) -> Routing | None:
        """The rollout engine's experts as a batch routing; ``None`` where it recorded none (an error for R3)."""
        if all(r is not None for r in rollout_routing):
            layers, experts = self.layout.layers, self.layout.num_experts
            return routing_for_batch(rollout_routing, batch, layers=layers, num_experts=experts)
        if self.policy.needs_rollout_routing():
            raise RlzooError(
                f"router policy {self.policy.name!r} needs the rollout engine's routing; the rollout engine did not "
                "record it (a rollout engine that declares can_record_routing records it when asked)"
            )
        return None

    def update(
        self, batch: TokenBatch, rows: torch.Tensor, loss_fn: LossFn, with_entropy: bool = False
    ) -> dict[str, float]:
        with self._recording(batch, rows, replay=self.replayed) as used:
            metrics = super().update(batch, rows, loss_fn, with_entropy)
        attention = batch.attention_mask[rows]
        per_layer = {}
        for layer in used.routing.layers:
            reference = (
                self.replayed if self.replayed is not None and layer in self.replayed.layers else self.recorded.old
            )
            if reference is None:  # routed afresh and no old pass recorded (old_logprobs: rollout-only)
                continue
            per_layer[layer] = flip_counts(
                reference.select(rows).only_layers([layer]), used.routing.only_layers([layer]), attention
            )
        if per_layer:
            pairs = per_layer.values()  # (differ, total) per layer, summed over the layers
            metrics["moe/flip_rate"] = _rate((sum(d for d, _ in pairs), sum(t for _, t in pairs)))
        metrics.update({f"moe/flip_rate/layer_{layer}": _rate(counts) for layer, counts in per_layer.items()})
        if self.replayed is not None:
            layers = self.replayed.layers
            fresh = used.fresh.only_layers(layers)
            metrics["moe/fresh_flip_rate"] = _rate(flip_counts(self.replayed.select(rows), fresh, attention))
            metrics["moe/replay_bytes"] = float(self.replayed.nbytes)
        return metrics

    def gradients(self, batch: TokenBatch, rows: torch.Tensor, request: GradientRequest) -> list[torch.Tensor]:
        """Under the routing an update of ``batch[rows]`` replays (the policy's ``update_routing``)."""
        with self._recording(batch, rows, replay=self.replayed):
            return super().gradients(batch, rows, request)

    def step_metrics(self) -> dict[str, float]:
        return {**self.metrics, **super().step_metrics()}

    @contextmanager
    def _recording(
        self, batch: TokenBatch, rows: torch.Tensor | None = None, replay: Routing | None = None
    ) -> Iterator[_Recorded]:
        """Around one pass over ``batch[rows]`` (all rows when ``None``) split over the ranks: replay this rank's
        share of ``replay`` if given, record the experts used; on exit ``routing`` (and ``fresh``, what the
        router chose itself in the replayed layers) hold the whole pass's rows, gathered from every rank."""
        mine = self.dist.share(torch.arange(batch.input_ids.shape[0]) if rows is None else rows)
        recorded = _Recorded()
        with self.engine.routing_pass(replay.select(mine) if replay is not None else None) as used:
            yield recorded
        recorded.routing = self._gather(self._filled(used.routing, "routing"))
        recorded.fresh = self._gather(self._filled(used.fresh, "fresh")) if replay is not None else recorded.routing

    def _filled(self, routing: Routing | None, name: str) -> Routing:
        """A routing the engine's ``routing_pass`` fills when its block ends (``RoutingPass.<name>``)."""
        if routing is None:
            raise RlzooError(f"training engine {self.engine.name!r}: its routing_pass left RoutingPass.{name} unset")
        return routing

    def _gather(self, routing: Routing) -> Routing:
        """Every rank's routing of its share, concatenated in rank order (the routing itself in one process)."""
        if not self.dist.active:
            return routing
        device = routing.indices.device
        return Routing.cat(self.dist.all_gather_object(routing.to("cpu"))).to(device)


class _Recorded:
    routing: Routing
    fresh: Routing


def _rate(counts: tuple[int, int]) -> float:
    differ, total = counts
    return differ / total if total else 0.0
