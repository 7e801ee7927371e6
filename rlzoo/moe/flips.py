"""Expert flip rates: how often two routings of the same tokens chose different experts, overall and per layer.

Experts are compared as *sets* per (token, layer): the top-k order is not meaningful (``torch.topk`` orders by
score, and two nearly equal scores may swap without changing the computation). A slot ``(token, layer, j)`` of
``a`` flips when ``a``'s ``j``-th expert is not among ``b``'s ``k`` experts for that token and layer; with ``k``
distinct experts on both sides the measure is symmetric. Counted over tokens where ``token_mask [B, S]``
(default: all) is non-zero and both routings carry a record; routings of different width are compared over
their common columns.
"""

from __future__ import annotations

import torch

from rlzoo.moe.routing import Routing

_CHUNK = 16384  # tokens per [M, L, k, k] comparison


def _flips_per_layer(a: Routing, b: Routing, token_mask: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """``([L] flipped slots per layer, counted tokens)``."""
    if a.layers != b.layers or a.top_k != b.top_k or a.batch_size != b.batch_size:
        raise ValueError(f"routings do not match: {a!r} vs {b!r}")
    width = min(a.seq_len, b.seq_len)
    device = a.indices.device
    mask = a.valid_mask()[:, :width] & b.valid_mask()[:, :width].to(device)
    if token_mask is not None:
        mask = mask & (token_mask[:, :width].to(device) != 0)
    ia = a.indices[:, :width][mask]  # [M, L, k]
    ib = b.indices[:, :width].to(device)[mask]
    flips = torch.zeros(len(a.layers), dtype=torch.int64)
    for start in range(0, ia.shape[0], _CHUNK):
        x = ia[start : start + _CHUNK].long()
        y = ib[start : start + _CHUNK].long()
        flips += (~(x.unsqueeze(-1) == y.unsqueeze(-2)).any(-1)).sum(dim=(0, 2)).cpu()
    return flips, int(ia.shape[0])


def flip_rate(a: Routing, b: Routing, token_mask: torch.Tensor | None = None) -> float:
    """Share of (token, layer, k) slots of ``a`` whose expert is not among ``b``'s experts for that token and layer.

    See the module docstring for the set semantics and which tokens count; 0.0 when no slot is counted.
    """
    flipped, slots = flip_counts(a, b, token_mask)
    return flipped / slots if slots else 0.0


def flip_counts(a: Routing, b: Routing, token_mask: torch.Tensor | None = None) -> tuple[int, int]:
    """``(flipped slots, counted slots)`` behind :func:`flip_rate`: counts add up across layers and passes."""
    flips, tokens = _flips_per_layer(a, b, token_mask)
    return int(flips.sum()), tokens * len(a.layers) * a.top_k


def flip_rate_per_layer(a: Routing, b: Routing, token_mask: torch.Tensor | None = None) -> dict[int, float]:
    """:func:`flip_rate` of each MoE layer alone, keyed by the model's decoder-layer index (``a.layers``).

    Layer ``l``'s value is the share of its (token, k) slots that flip, over the same tokens as :func:`flip_rate`,
    so :func:`flip_rate` is the mean of these values. 0.0 for every layer when no token is counted.
    """
    flips, tokens = _flips_per_layer(a, b, token_mask)
    slots = tokens * a.top_k
    return {layer: (int(count) / slots if slots else 0.0) for layer, count in zip(a.layers, flips.tolist())}
