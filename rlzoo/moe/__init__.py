"""Routing Replay for mixture-of-experts models: record the experts a forward pass used, replay them later.

One module per job; every public name is re-exported here (``from rlzoo.moe import X``):

- :mod:`~rlzoo.moe.routers` — :func:`find_routers`, the model's MoE routers keyed by decoder-layer index (the one
  router finder of every engine), and :func:`layout`.
- :mod:`~rlzoo.moe.routing` — :class:`Routing`, the ``[B, S, L, k]`` record, stored as :func:`index_dtype`.
- :mod:`~rlzoo.moe.record` — :func:`record_routing`: ``with record_routing(model) as routing: model(...)``;
  afterwards ``routing`` holds the top-k expert indices of every (row, position, MoE layer).
- :mod:`~rlzoo.moe.replay` — :func:`replay_routing`: ``with replay_routing(model, routing) as replay: model(...)``:
  every router of the routing's layers returns the recorded experts (the others route afresh); the gate weights are the *current* router's gate function
  (:mod:`~rlzoo.moe.gates`) at those experts, so the router still receives gradient. ``replay.fresh`` is the
  routing the current router would have chosen (for the ``moe/flip_rate`` metric).
- :mod:`~rlzoo.moe.flips` — :func:`flip_rate` / :func:`flip_rate_per_layer`: share of (token, layer, k) slots
  whose expert differs between two routings.
- :mod:`~rlzoo.moe.rollout` — :func:`routing_for_batch`: rollout-engine routings (``Generation.routing``) aligned
  with a :class:`~rlzoo.engines.base.TokenBatch`, for Rollout Routing Replay (R3); :func:`stitch_routing`: one
  routing for a sequence sampled by several engine calls.
- :mod:`~rlzoo.moe.balance` — :func:`load_balancing_loss`, the router load-balancing (aux) loss, and
  :class:`RouterLogits`, which collects its inputs.

No global patching: every hook is registered on one module *instance* and removed on exit.

The router contract
-------------------
A router is a module whose forward returns ``(router_logits [N, E], scores [N, k], indices [N, k])`` for the
``N = B*S`` flattened tokens of a ``[B, S]`` forward, and whose block then runs the experts with ``indices`` and
``scores``. transformers 5.x implements this in ``*TopKRouter`` (``model.layers.i.mlp.gate``; GPT-OSS:
``mlp.router``). Any module with the same contract works, e.g. a DeepSpeed-MoE conversion that keeps an HF-style
``mlp.gate``. Replay recomputes the scores from ``router_logits`` with the gate function detected per router
(:mod:`rlzoo.moe.gates`; an error names the router if none fits, e.g. sigmoid / bias-corrected / grouped routers).

Positions and layers
--------------------
Records are keyed by decoder-layer index (parsed from the module path ``...layers.<i>...``), never by call order,
so gradient-checkpointing recomputation during backward replays the right layer. A root forward pre-hook reads
the ``[B, S]`` shape of each forward. :class:`Routing` stores ``[B, S, L, k]`` indices (``L`` = MoE layers in
layer order) compactly — ``uint8`` when the model has at most 256 experts, else ``int16`` — plus an optional
``valid [B, S]`` mask: positions marked invalid are routed afresh by the current router during replay.
"""

from __future__ import annotations

from rlzoo.moe.balance import RouterLogits, load_balancing_loss
from rlzoo.moe.flips import flip_counts, flip_rate, flip_rate_per_layer
from rlzoo.moe.gates import GATE_FUNCTIONS
from rlzoo.moe.record import RoutingRecorder, record_routing
from rlzoo.moe.replay import RoutingReplay, replay_routing
from rlzoo.moe.rollout import routing_for_batch, stitch_routing
from rlzoo.moe.routers import Layout, RouterInfo, RoutingError, find_routers, layout, require_routers
from rlzoo.moe.routing import Routing, index_dtype

__all__ = [
    "GATE_FUNCTIONS",
    "Layout",
    "RouterInfo",
    "RouterLogits",
    "Routing",
    "RoutingError",
    "RoutingRecorder",
    "RoutingReplay",
    "find_routers",
    "flip_counts",
    "flip_rate",
    "flip_rate_per_layer",
    "index_dtype",
    "layout",
    "load_balancing_loss",
    "record_routing",
    "replay_routing",
    "require_routers",
    "routing_for_batch",
    "stitch_routing",
]
