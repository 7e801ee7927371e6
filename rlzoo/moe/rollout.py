"""Rollout routings for Rollout Routing Replay (R3): place the rollout engine's records into a batch's positions.

A rollout engine (``Generation.routing``) records ``[len(prompt) + len(response) - 1, L, k]`` experts per
generation; :func:`routing_for_batch` turns them into a :class:`Routing` aligned with a
:class:`~rlzoo.engines.base.TokenBatch`, for :func:`rlzoo.moe.replay_routing`. A generation sampled by several engine
calls (the turns of an episode, the pieces of a partial rollout) is given one routing by :func:`stitch_routing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlzoo.errors import RlzooError
from rlzoo.moe.routers import RoutingError, layout
from rlzoo.moe.routing import Routing, index_dtype


def routing_for_batch(
    routings: Sequence[torch.Tensor | None],
    batch: Any,
    model: nn.Module | None = None,
    *,
    layers: Sequence[int] | None = None,
    num_experts: int | None = None,
    allow_missing: bool = False,
) -> Routing:
    """Place rollout routings (``Generation.routing``, one per TokenBatch row) into the batch's positions.

    Each ``routings[i]`` is ``[len(prompt) + len(response) - 1, L, k]`` (prompt tokens, then every response token
    except the last, which the rollout engine never ran through the model). TokenBatch row ``i`` holds
    ``prompt + response`` left-aligned and right-padded, so the record goes to columns ``0 .. n-2``. The last
    token's column and the padding are marked invalid: replay routes them afresh. Neither influences any response
    token's log-prob (the causal model reads a position only from later positions, and the last position predicts
    nothing), so the fallback is exact for the loss. ``layers`` / ``num_experts`` come from ``model`` unless given.
    A row without a routing raises, unless ``allow_missing`` (then the whole row is routed afresh).
    """
    if model is not None:
        model_layers, model_experts, _ = layout(model)
        layers = model_layers if layers is None else layers
        num_experts = model_experts if num_experts is None else num_experts
    present = [r for r in routings if r is not None]
    if layers is None or num_experts is None:
        raise ValueError("pass the model, or both layers and num_experts")
    if len(routings) != batch.input_ids.shape[0]:
        raise ValueError(f"{len(routings)} routings for a batch of {batch.input_ids.shape[0]} rows")
    if not present and not allow_missing:
        raise RoutingError("no generation carries a routing: did the rollout engine record it?")
    top_k = present[0].shape[-1] if present else 1
    rows, width = batch.input_ids.shape
    lengths = batch.attention_mask.sum(dim=1).tolist()
    indices = torch.zeros((rows, width, len(layers), top_k), dtype=index_dtype(num_experts))
    valid = torch.zeros((rows, width), dtype=torch.bool)
    for row, routing in enumerate(routings):
        if routing is None:
            if not allow_missing:
                raise RoutingError(f"row {row} has no rollout routing (allow_missing=True routes it afresh)")
            continue
        n = int(lengths[row])
        if routing.dim() != 3 or routing.shape[0] != n - 1 or routing.shape[1:] != (len(layers), top_k):
            raise RoutingError(
                f"row {row}: rollout routing of shape {tuple(routing.shape)}; expected [{n - 1}, {len(layers)}, "
                f"{top_k}] for {n} tokens (prompt + response - 1)"
            )
        if n > 1:
            indices[row, : n - 1] = routing.to(indices.dtype)
            valid[row, : n - 1] = True
    return Routing(indices, layers, num_experts, valid)


def stitch_routing(stitched: torch.Tensor | None, call: torch.Tensor, positions: int) -> torch.Tensor:
    """Join one engine call's routing ``call`` (``[positions of its call, layers, top_k]``, from position 0) onto the
    sequence's routing so far, giving ``positions`` rows.

    Every position keeps the experts of the engine call that first ran it: a call's own decode for its sampled
    tokens, the next call's prefill for the previous call's last token and anything appended between them (an
    episode's observation). A later call's prefill re-routes the earlier positions too (after a weight update in
    flight, with other weights), but those are not the experts that produced the earlier tokens, so they never
    overwrite them. Used for an episode's turns (:mod:`rlzoo.episodes.runner`) and for a partial rollout's pieces
    (``rollout.partial: continue``)."""
    kept = 0 if stitched is None else stitched.shape[0]
    if call.shape[0] < positions:
        raise RlzooError(f"an engine call's routing covers {call.shape[0]} positions, the sequence needs {positions}")
    new = call[kept:positions]
    return new.clone() if stitched is None else torch.cat([stitched, new])
