"""The training engine as one RL step sees it: whole-batch log-probs, minibatch updates, weights pushed out.

The loop never sees processes or MoE routing. A :class:`Learner` wraps a :class:`TrainingEngine` and the run's
:class:`~rlzoo.runtime.distributed.Dist`:

- :meth:`Learner.old_logprobs` — the behaviour policy's ``[B, T]`` log-probs and entropies of the whole batch
  (the entropy comes from the same no-gradient pass, so ``policy/entropy`` costs no extra forward), or
  :meth:`Learner.without_old_pass` when the rollout engine's log-probs stand in for them;
- :meth:`Learner.logprobs` — ``[B, T]`` log-probs of the whole batch: each rank computes its share of the rows
  (``Dist.share``) and the shares are gathered, so every rank holds the same full tensor;
- :meth:`Learner.update` — one optimizer step on the minibatch ``rows``: each rank runs forward and backward on its
  share; ``loss_fn`` receives the log-probs of the *whole* minibatch (the other ranks' rows without gradient), so
  every aggregation sees the global normaliser, and the loss is multiplied by the world size because the engine
  averages the ranks' gradients while each rank's holds only its rows' part of the sum;
- :meth:`Learner.push_weights` — the new weights into rank 0's rollout engine, or into every rank's when each
  rank samples (every rank joins when gathering the weights is a collective, ``TrainingEngine.collective_weights``);
  under LoRA the adapters themselves when the run chose to send them (``sends_adapters``), else the merged weights.

In one process every collective is the identity, so the learner is a thin pass-through. MoE policies get
:class:`rlzoo.rl.routing_learner.RoutingLearner`, which adds the router policy's record/replay around the same calls.

The engines' own metrics (``Component.report``) are collected in scopes (:func:`~rlzoo.interfaces.base.collecting`):
each :meth:`Learner.update` is one (the training engine's reports are part of that minibatch's metrics, so they
combine over the step's minibatches as declared); the whole-batch passes (the old-log-prob pass, token statistics,
values) and the weight pushes and captures, where the rollout engine's weight sync reports too, collect into
:attr:`Learner.reports`, which reaches the step through :meth:`Learner.step_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from rlzoo.engines import Adapter, GradientRequest, LossFn, RolloutEngine, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import select_rows
from rlzoo.errors import RlzooError
from rlzoo.interfaces.base import collecting
from rlzoo.runtime.distributed import SINGLE, Dist

Outputs = TypeVar("Outputs", torch.Tensor, tuple[torch.Tensor, ...], dict[str, torch.Tensor])


@dataclass
class WeightsUpdate:
    """One version of the policy on its way to a rollout engine: its LoRA adapters, or all its weights."""

    adapter: Adapter | None = None
    weights: list[tuple[str, torch.Tensor]] | None = None

    def load_into(self, rollout: RolloutEngine) -> None:
        if self.adapter is not None:
            rollout.sync_adapter(self.adapter)
        elif self.weights is not None:
            rollout.sync_weights(self.weights)
        else:  # capture_weights hands no update without one or the other
            raise ValueError("a WeightsUpdate holds the adapters or the weights; this one holds neither")


class Learner:
    """Whole-batch log-probs and minibatch updates of one training engine, over the run's processes."""

    def __init__(self, engine: TrainingEngine, dist: Dist = SINGLE) -> None:
        self.engine = engine
        self.dist = dist
        self.sends_adapters = False  # set by the run's assembly (model.lora.sync); else the (merged) weights
        self._adapter_version = 0
        self.reports: dict[str, float] = {}  # the engines' reports outside the updates (a scope), until step_metrics

    def old_logprobs(
        self, batch: TokenBatch, rollout_logp: torch.Tensor, rollout_routing: list[torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, T]`` log-probs and entropies of the behaviour policy (before any update of this rollout batch).

        ``rollout_logp`` are the rollout engine's log-probs and ``rollout_routing`` each row's
        ``Generation.routing`` (``None`` where the engine recorded none); MoE learners use them."""
        return self.logprobs_and_entropy(batch)

    def without_old_pass(self, batch: TokenBatch, rollout_routing: list[torch.Tensor | None]) -> None:
        """Instead of :meth:`old_logprobs` when the rollout engine's log-probs are the old ones and nothing needs
        the training engine's (``algorithm.old_logprobs: rollout-only``): prepare the updates of ``batch``."""

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` log-probs of every row of ``batch`` under the current weights, without gradient."""
        return self._whole_batch(batch, self.engine.logprobs)

    def token_stats(self, batch: TokenBatch, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """``[B, T]`` each named token statistic (:mod:`rlzoo.engines.token_stats`) at every response position of
        ``batch`` under the current weights, without gradient."""
        return self._whole_batch(batch, lambda rows: self.engine.token_stats(rows, names))

    def values(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` values of every row of ``batch`` (a critic's engine, head ``"value"``), without gradient."""
        return self._whole_batch(batch, self.engine.values)

    def logprobs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, T]`` log-probs and entropies of every row of ``batch``, without gradient."""
        logp, entropy = self._whole_batch(batch, self.engine.logprobs_and_entropy)
        return logp, entropy

    def _whole_batch(self, batch: TokenBatch, local_pass: Callable[[TokenBatch], Outputs]) -> Outputs:
        """``local_pass`` on this rank's share of ``batch``'s rows (``Dist.share``), each of its ``[rows, T]``
        outputs (one tensor, a tuple or a dict of them) gathered, so every rank holds the same full tensors."""
        count = batch.input_ids.shape[0]
        with collecting(into=self.reports):
            local = local_pass(select_rows(batch, self.dist.share(torch.arange(count))))
        if isinstance(local, torch.Tensor):
            return self.dist.gather_rows(local, count)
        if isinstance(local, dict):
            return {name: self.dist.gather_rows(t, count) for name, t in local.items()}
        return tuple(self.dist.gather_rows(t, count) for t in local)

    def update(
        self, batch: TokenBatch, rows: torch.Tensor, loss_fn: LossFn, with_entropy: bool = False
    ) -> dict[str, float]:
        """One optimizer step on ``batch[rows]``; ``loss_fn(logp [len(rows), T]) -> (loss, metrics)``, or
        ``loss_fn(logp, entropy)`` with ``with_entropy`` (both with gradient)."""
        local = select_rows(batch, self.dist.share(rows))
        with collecting() as reports:  # the engine's, of this minibatch (the loss's own are in its metrics)
            metrics = self.engine.train_step(local, self._global_loss(loss_fn, len(rows)), with_entropy)
        return {**metrics, **reports}

    def gradients(self, batch: TokenBatch, rows: torch.Tensor, request: GradientRequest) -> list[torch.Tensor]:
        """Each loss of ``request`` differentiated on ``batch[rows]`` at the current weights, projected, without a step
        (:meth:`TrainingEngine.gradients`): a measurement's, in one process (the ranks' parts are not summed)."""
        if self.dist.active:
            raise RlzooError("Learner.gradients runs in one process; its gradients are not summed over ranks")
        with collecting(into=self.reports):
            return self.engine.gradients(select_rows(batch, rows), request)

    def _global_loss(self, loss_fn: LossFn, count: int) -> LossFn:
        if not self.dist.active:
            return loss_fn

        def global_loss(*local: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            loss, metrics = loss_fn(*(self.dist.gather_rows_differentiable(t, count) for t in local))
            return loss * self.dist.world, metrics

        return global_loss

    def capture_weights(self, every_rank: bool = False) -> WeightsUpdate | None:
        """A copy of the current weights (or, with ``sends_adapters``, the adapters) that a rollout engine loads
        later, while training goes on (:mod:`rlzoo.rl.async_rollouts`): on rank 0, or with ``every_rank`` on each
        rank; ``None`` on a rank that samples nothing (it still joins a gather of sharded weights, ZeRO-3)."""
        receives = every_rank or self.dist.is_main
        if not (self.engine.collective_weights or receives):
            return None
        with collecting(into=self.reports):
            if self.sends_adapters:
                self._adapter_version += 1
                update = WeightsUpdate(adapter=self.engine.adapter(self._adapter_version))  # a CPU copy already
            else:
                weights = self.engine.named_weights()  # on every rank: a gather of partitioned weights (ZeRO-3)
                if receives:
                    update = WeightsUpdate(weights=[(name, t.detach().clone()) for name, t in weights])
                else:
                    _drain(weights)  # each step of it may be a gather the receiving rank waits on
                    update = None
        return update if receives else None

    def push_weights(self, rollout: RolloutEngine, every_rank: bool = False) -> None:
        """Send the current weights to this rank's rollout engine: rank 0's only, or with ``every_rank`` each
        rank's own (the data-parallel update leaves the same weights on every rank)."""
        receives = every_rank or self.dist.is_main
        if not (self.engine.collective_weights or receives):
            return
        with collecting(into=self.reports):  # the training engine's and the rollout engine's (its weight sync)
            if self.sends_adapters:
                self._adapter_version += 1
                adapter = self.engine.adapter(self._adapter_version)
                if receives:
                    rollout.sync_adapter(adapter)
            else:
                weights = self.engine.named_weights()
                if receives:
                    rollout.sync_weights(weights)
                else:
                    _drain(weights)

    def step_metrics(self) -> dict[str, float]:
        """Diagnostics of the rollout batch just trained on (none for a dense policy), and the engines' reports
        since the last call outside the updates (the whole-batch passes, the weight push)."""
        reports, self.reports = self.reports, {}
        return reports


def _drain(weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Take part in the gathers of a lazy, collective weight iterator without keeping anything: a ZeRO-3 push gathers
    one layer per step of the iteration (:mod:`rlzoo.engines.deepspeed.layerwise`), and the ranks that receive
    nothing must step through it in lockstep with the one that does, or the receiver's next gather waits forever."""
    for _ in weights:
        pass
