"""The MoE load-balancing term every training engine adds to its loss: one parameter, one metric, one formula.

``loss = loss_fn(logp) + aux_loss_coef * aux`` where ``aux`` is :func:`rlzoo.moe.load_balancing_loss` of the
router logits of the training forward, over the batch's non-padding tokens; ``train/aux_loss`` reports ``aux``
for every MoE model (whatever the coefficient), and nothing is added for a dense model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from pydantic import Field
from torch import nn

from rlzoo.interfaces.base import Params
from rlzoo.moe import RouterLogits, find_routers
from rlzoo.moe.balance import BalanceTerms

METRIC = "train/aux_loss"


class AuxLossParams(Params):
    """Parameters every training engine shares (subclass it for an engine's ``Params``)."""

    aux_loss_coef: float = Field(
        0.0, ge=0.0, description="MoE router load-balancing loss coefficient added to the loss when > 0"
    )


class AuxLoss:
    """Collects the router logits of a training forward and adds ``coef * aux`` to that step's loss."""

    def __init__(self, model: nn.Module, coef: float) -> None:
        self.coef = coef
        self._logits = RouterLogits(find_routers(model))

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Wrap the training forward (not the no-grad log-prob passes): its router logits are collected."""
        with self._logits.collect():
            yield

    def terms(self, token_mask: torch.Tensor) -> BalanceTerms | None:
        """The last :meth:`forward`'s :class:`BalanceTerms` over its ``token_mask`` positions (``None`` if dense)."""
        terms = self._logits.terms(token_mask)
        self._logits.clear()
        return terms

    def add_whole(
        self, loss: torch.Tensor, metrics: dict[str, float], whole: BalanceTerms | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Like :meth:`add`, for a minibatch whose micro-batches' terms summed to ``whole`` (value only)."""
        if whole is None:
            return loss, metrics
        aux = whole.loss()
        metrics = {**metrics, METRIC: aux.detach()}  # read with the step's other metrics, at once
        return (loss + self.coef * aux.to(loss.device) if self.coef > 0 else loss), metrics

    def share(self, part: BalanceTerms | None, whole: BalanceTerms | None) -> torch.Tensor | float:
        """``coef x`` this micro-batch's share of the minibatch's aux loss (its gradient is the whole loss's part)."""
        if part is None or whole is None or self.coef == 0:
            return 0.0
        return self.coef * part.share(whole)

    def add(
        self, loss: torch.Tensor, metrics: dict[str, float], attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss + coef * aux, metrics + {train/aux_loss: aux})`` of the last :meth:`forward`; unchanged if dense."""
        aux = self._logits.loss(attention_mask)
        self._logits.clear()
        if aux is None:
            return loss, metrics
        metrics = {**metrics, METRIC: aux.detach()}  # read with the step's other metrics, at once
        if self.coef > 0:
            loss = loss + self.coef * aux.to(loss.device)  # the router's device (the policy loss's, in one process)
        return loss, metrics
