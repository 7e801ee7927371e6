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
    return torch.sum((counts / rows) * (prob_sum / rows)) * num_experts


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
        if not self.logits:
            return None
        return load_balancing_loss(self.logits, self.routers[0].num_experts, self.routers[0].top_k, attention_mask)
