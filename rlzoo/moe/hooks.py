"""Hook plumbing shared by recording and replay: a root forward's ``[B, S]`` shape, router outputs, hook handles.

A root forward pre-hook reads the ``[B, S]`` shape of each forward (:func:`input_shape`); router hooks put each
layer's ``[N, k]`` indices into :class:`ForwardCalls`, which turns them into one :class:`~rlzoo.moe.routing.Routing`
per root forward. Router calls outside a root forward (gradient-checkpointing recomputation in backward) are
ignored: that forward was already recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.moe.routers import RouterInfo, RoutingError
from rlzoo.moe.routing import Routing, index_dtype


@dataclass
class ForwardLayout:
    """Where each position of a forward's ``[b, w]`` input comes from in the batch the engine was given: batch
    row ``rows`` (-1: padding), position ``positions``, of a ``[batch_size, seq_len]`` batch. A training engine
    that cuts a batch into packed or reordered micro-batches announces it around each forward
    (:func:`forward_layout`), so records and replays stay in the batch's own layout."""

    rows: torch.Tensor
    positions: torch.Tensor
    batch_size: int
    seq_len: int


_layouts: list[ForwardLayout] = []


@contextmanager
def forward_layout(layout: ForwardLayout) -> Iterator[None]:
    """Forwards inside the block have ``layout``; without one a forward's rows are the batch's next rows."""
    _layouts.append(layout)
    try:
        yield
    finally:
        _layouts.pop()


def current_layout() -> ForwardLayout | None:
    return _layouts[-1] if _layouts else None


def input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """``(B, S)`` of a root forward from its ``input_ids`` / ``inputs_embeds`` (keyword or first positional)."""
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return int(value.shape[0]), int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[0]), int(args[0].shape[1])
    return None


def check_output(info: RouterInfo, output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A router's ``(router_logits, scores, indices)``, or a :class:`RoutingError` naming the router."""
    if not (isinstance(output, tuple) and len(output) == 3):
        raise RoutingError(
            f"router {info.name} ({type(info.module).__name__}) returned {type(output).__name__}, "
            "not the (router_logits, scores, indices) tuple of the router contract"
        )
    logits, scores, indices = output
    if indices.dtype.is_floating_point or indices.dim() != 2 or indices.shape[-1] != info.top_k:
        raise RoutingError(
            f"router {info.name} ({type(info.module).__name__}) returned indices of dtype {indices.dtype} and shape "
            f"{tuple(indices.shape)}; the router contract expects integer [tokens, top_k={info.top_k}] as 3rd output"
        )
    return logits, scores, indices


class ForwardCalls:
    """Per root-forward bookkeeping shared by recorder and replay: the current call's shape and layer records."""

    def __init__(self, routers: list[RouterInfo]) -> None:
        self.routers = routers
        self.layers = tuple(r.layer for r in routers)
        self.num_experts = routers[0].num_experts
        self.top_k = routers[0].top_k
        self.active: dict[int, torch.Tensor] | None = None  # layer -> [N, k], during a root forward
        self.shape: tuple[int, int] | None = None
        self.calls: list[Routing] = []
        self.layouts: list[ForwardLayout | None] = []
        self._layout: ForwardLayout | None = None

    def begin(self, shape: tuple[int, int] | None) -> None:
        self.active = {}
        self.shape = shape
        self._layout = current_layout()

    def put(self, layer: int, indices: torch.Tensor) -> None:
        if self.active is not None:  # None outside a root forward: checkpoint recomputation, already recorded
            self.active[layer] = indices.detach().to(index_dtype(self.num_experts))

    def end(self) -> Routing | None:
        active, self.active = self.active, None
        if not active:
            return None
        missing = [layer for layer in self.layers if layer not in active]
        if missing:
            raise RoutingError(f"routers of layers {missing} did not run in this forward pass")
        stacked = torch.stack([active[layer] for layer in self.layers], dim=1)  # [N, L, k]
        n = stacked.shape[0]
        b, s = self.shape if self.shape is not None and self.shape[0] * self.shape[1] == n else (1, n)
        routing = Routing(stacked.reshape(b, s, len(self.layers), self.top_k), self.layers, self.num_experts)
        self.calls.append(routing)
        self.layouts.append(self._layout)
        return routing

    def routing(self) -> Routing:
        """Every call's routing as one batch: written back through the layouts the engine announced, else the
        calls' rows concatenated (micro-batches in row order, or a prefill then one call per decoded token)."""
        if not self.calls:
            return Routing.empty(self.layers, self.num_experts, self.top_k)
        if all(layout is not None for layout in self.layouts):
            last = self.layouts[-1]
            parts = [(c, lay.rows, lay.positions) for c, lay in zip(self.calls, self.layouts, strict=True)]
            return Routing.scatter(parts, last.batch_size, last.seq_len)
        return self.calls[0] if len(self.calls) == 1 else Routing.cat(self.calls)


class HookHandles:
    """The handles of the hooks one recorder / replay registered, removed together."""

    def __init__(self) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()
