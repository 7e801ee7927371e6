"""Finding a model's MoE routers: the one router finder every engine and every routing tool uses.

A router is a module whose forward returns ``(router_logits [N, E], scores [N, k], indices [N, k])`` for the
``N = B*S`` flattened tokens of a ``[B, S]`` forward, and whose block then runs the experts with ``indices`` and
``scores`` (the router contract; see :mod:`rlzoo.moe`). transformers 5.x implements this in ``*TopKRouter``
(``model.layers.i.mlp.gate``; GPT-OSS: ``mlp.router``); a DeepSpeed-MoE conversion
(:mod:`rlzoo.models.deepspeed_moe`) keeps the same module as ``mlp.gate``, so it is found there too.

Routers are keyed by decoder-layer index, parsed from the module path ``...layers.<i>...`` (never by call order,
so gradient-checkpointing recomputation maps to the right layer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn


class RoutingError(RuntimeError):
    """A model's routers do not fit the contract, or a routing does not fit the forward pass it is replayed in."""


_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class RouterInfo:
    layer: int  # decoder-layer index
    name: str  # qualified module name, e.g. "model.layers.3.mlp.gate"
    module: nn.Module
    num_experts: int
    top_k: int


class Layout(NamedTuple):
    """The shape of a model's routing: MoE decoder-layer indices (ascending), experts per layer, experts per token."""

    layers: tuple[int, ...]
    num_experts: int
    top_k: int


def _is_router(name: str, module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    top_k = getattr(module, "top_k", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not isinstance(top_k, int):
        return False
    leaf = name.rsplit(".", 1)[-1]
    return type(module).__name__.endswith("Router") or leaf in ("gate", "router")


def find_routers(model: nn.Module) -> list[RouterInfo]:
    """Every MoE router in ``model`` (see the module docstring for the contract), sorted by layer index.

    A router is a module with a 2-D ``weight`` ``[num_experts, hidden]`` and an integer ``top_k`` whose class name
    ends in ``Router`` or whose attribute name is ``gate`` / ``router``. Routers outside a ``layers.<i>`` path get
    the index of their position in module order. A dense model has none (``[]``).
    """
    found: list[tuple[int, str, nn.Module]] = []
    for position, (name, module) in enumerate(model.named_modules()):
        if not _is_router(name, module):
            continue
        matches = list(_LAYER_RE.finditer(name))
        match = matches[-1] if matches else None  # the innermost "layers.<i>" wins
        found.append((int(match.group(1)) if match else position, name, module))
    layers = [layer for layer, _, _ in found]
    if len(set(layers)) != len(layers):
        dupes = sorted({layer for layer in layers if layers.count(layer) > 1})
        raise RoutingError(f"more than one router found in decoder layer(s) {dupes}: {[n for _, n, _ in found]}")
    infos = []
    for layer, name, module in sorted(found, key=lambda t: t[0]):
        num_experts = getattr(module, "num_experts", None)
        if not isinstance(num_experts, int):
            num_experts = int(module.weight.shape[0])
        infos.append(RouterInfo(layer, name, module, num_experts, int(module.top_k)))
    return infos


def require_routers(model: nn.Module) -> list[RouterInfo]:
    """:func:`find_routers`, refusing a model without routers or whose routers differ in ``top_k`` / experts."""
    routers = find_routers(model)
    if not routers:
        raise RoutingError(f"{type(model).__name__} has no MoE router (no module named gate/router with top_k)")
    if len({r.top_k for r in routers}) != 1 or len({r.num_experts for r in routers}) != 1:
        raise RoutingError("routers differ in top_k or num_experts; Routing assumes one [layers, top_k] layout")
    return routers


def layout(model: nn.Module) -> Layout:
    """The routing layout of ``model`` (raises :class:`RoutingError` as :func:`require_routers`)."""
    return layout_of(require_routers(model))


def layout_of(routers: list[RouterInfo]) -> Layout:
    """The routing layout of the routers :func:`require_routers` returned."""
    return Layout(tuple(r.layer for r in routers), routers[0].num_experts, routers[0].top_k)
