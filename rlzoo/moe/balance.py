"""The MoE router load-balancing (aux) loss: transformers' Switch-Transformer loss over every MoE layer.

Reference: Fedus et al. 2021 (Switch Transformer, eq. 4) as transformers implements it in
``load_balancing_loss_func``: ``aux = E * sum_e f_e * P_e``, where, over the non-padding tokens of every MoE layer
together, ``f_e`` is the share of tokens whose top-k includes expert ``e`` (the ``f_e`` sum to ``k``) and ``P_e``
the mean router probability ``softmax(router_logits)_e`` (fp32). It is differentiable through ``P_e`` (the router
logits), not through the top-k choice.

:class:`RouterLogits` collects the logits from the routers :func:`rlzoo.moe.find_routers` finds, so every training
engine (transformers or DeepSpeed-MoE blocks) computes the same value from the same forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rlzoo.moe.hooks import HookHandles, check_output
from rlzoo.moe.routers import RouterInfo


def load_balancing_loss(
    router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """``E * sum_e f_e * P_e`` over all layers' ``[N, E]`` router logits, padding excluded (module docstring).

    ``attention_mask [B, S]`` (``N = B*S`` row-major, as routers flatten tokens) weights each token; ``None``
    counts every token.
    """
    return balance_terms(router_logits, num_experts, top_k, attention_mask).loss()


@dataclass
class BalanceTerms:
    """The sums the load-balancing loss is made of: per expert, the tokens whose top-k holds it (``counts``) and
    the router probability summed over tokens (``prob_sum``, differentiable); ``rows`` tokens in all (x layers).

    Sums add across micro-batches, so a minibatch's loss is :meth:`loss` of the summed terms; the top-k counts carry
    no gradient, hence ``sum over micro-batches of`` :meth:`share` ``(whole)`` has the whole loss's value and
    gradient while each micro-batch's graph is freed after its own backward."""

    counts: torch.Tensor
    prob_sum: torch.Tensor
    rows: torch.Tensor

    def loss(self) -> torch.Tensor:
        rows = self.rows.clamp(min=1.0)  # no token (a stand-in forward): 0, not NaN
        return torch.sum((self.counts / rows) * (self.prob_sum / rows)) * self.counts.shape[0]

    def share(self, whole: BalanceTerms) -> torch.Tensor:
        """This micro-batch's part of ``whole.loss()``: ``E * sum_e f_e(whole) * prob_sum_e(this) / rows(whole)``."""
        rows = whole.rows.clamp(min=1.0)
        return torch.sum((whole.counts / rows) * (self.prob_sum / rows)) * self.counts.shape[0]

    def detach(self) -> BalanceTerms:
        return BalanceTerms(self.counts.detach(), self.prob_sum.detach(), self.rows.detach())

    def __add__(self, other: BalanceTerms) -> BalanceTerms:
        return BalanceTerms(self.counts + other.counts, self.prob_sum + other.prob_sum, self.rows + other.rows)


def balance_terms(
    router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int, attention_mask: torch.Tensor | None
) -> BalanceTerms:
    """:class:`BalanceTerms` of all layers' ``[N, E]`` router logits, weighted as :func:`load_balancing_loss`."""
    device = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    weight = attention_mask.reshape(-1).to(device=device, dtype=torch.float32) if attention_mask is not None else None
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        _, chosen = torch.topk(probs, top_k, dim=-1)
        w = weight if weight is not None else torch.ones(probs.shape[0], device=device)
        counts = counts.scatter_add(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        prob_sum = prob_sum + (probs * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    return BalanceTerms(counts, prob_sum, rows)


class RouterLogits:
    """The router logits of the forward passes run inside :meth:`collect`, and their load-balancing loss.

    Hooks are registered on the router module instances on entering :meth:`collect` and removed on exit, so
    backward recomputation (gradient checkpointing) and forwards outside the block add nothing.
    """

    def __init__(self, routers: Sequence[RouterInfo]) -> None:
        self.routers = list(routers)
        self.logits: list[torch.Tensor] = []

    @contextmanager
    def collect(self) -> Iterator[list[torch.Tensor]]:
        """Collect (afresh) every router call's ``[N, E]`` logits, in call order, into the yielded list."""
        self.logits = []
        handles = HookHandles()
        for info in self.routers:

            def hook(_module, _args, output, info=info):
                self.logits.append(check_output(info, output)[0])

            handles.handles.append(info.module.register_forward_hook(hook))
        try:
            yield self.logits
        finally:
            handles.remove()

    def clear(self) -> None:
        """Drop the collected logits (and the autograd graph they hold)."""
        self.logits = []

    def loss(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """:func:`load_balancing_loss` of the collected logits; ``None`` when nothing was collected (dense model)."""
        terms = self.terms(attention_mask)
        return None if terms is None else terms.loss()

    def terms(self, attention_mask: torch.Tensor | None) -> BalanceTerms | None:
        """:func:`balance_terms` of the collected logits; ``None`` when nothing was collected (dense model)."""
        if not self.logits:
            return None
        return balance_terms(self.logits, self.routers[0].num_experts, self.routers[0].top_k, attention_mask)
