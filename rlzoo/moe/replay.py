"""Replaying routing: while attached, every router of a model returns the experts of a recorded :class:`Routing`.

The gate weights are the *current* router's gate function (:mod:`rlzoo.moe.gates`) at the recorded experts, so
the router still receives gradient; ``RoutingReplay.fresh`` is the routing the current router would have chosen
(for the ``moe/flip_rate`` metric). No global patching: every hook is registered on one module *instance* and
removed on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rlzoo.moe.gates import detect_gate, gate_weights
from rlzoo.moe.hooks import ForwardCalls, HookHandles, check_output, current_layout, input_shape
from rlzoo.moe.routers import RouterInfo, RoutingError, require_routers
from rlzoo.moe.routing import Routing


class RoutingReplay:
    """While attached, every router of ``model`` in ``routing.layers`` returns the experts of ``routing`` (see
    :func:`replay_routing`); the routers of other layers route afresh.

    Forward passes consume rows of ``routing`` in order: a forward over ``B`` rows takes the next ``B`` rows
    (all of them when ``B`` equals the routing's batch size), wrapping around at the end, so an engine that splits
    a minibatch into contiguous micro-batches (forward + backward each, in order) is replayed correctly. Use
    :meth:`set` to switch to another routing between forwards. A forward narrower than the routing uses its
    first columns; a wider one routes the extra columns afresh.

    ``fresh`` collects, per forward (rows concatenated), the experts the current router would have chosen itself;
    ``flip_rate(routing, replay.fresh, mask)`` is the expert flip rate that replay removed.
    """

    def __init__(
        self,
        model: nn.Module,
        routing: Routing,
        routers: list[RouterInfo] | None = None,
        gates: dict[int, str] | None = None,
    ) -> None:
        self.model = model
        self.routers = require_routers(model) if routers is None else routers
        self._fresh = ForwardCalls(self.routers)
        self._hooks = HookHandles()
        self._gates: dict[int, str] = {} if gates is None else gates
        self._current: dict[int, tuple[torch.Tensor, torch.Tensor | None]] | None = None
        self._cursor = 0
        self.calls = 0
        self.set(routing)

    def set(self, routing: Routing) -> None:
        """Replay ``routing`` from the next forward on (its row cursor restarts at 0)."""
        layers = tuple(r.layer for r in self.routers)
        if not routing.layers or not set(routing.layers) <= set(layers):
            raise RoutingError(f"routing covers layers {routing.layers}, the model's routers are in layers {layers}")
        if routing.top_k != self.routers[0].top_k or routing.num_experts != self.routers[0].num_experts:
            raise RoutingError(
                f"routing has top_k={routing.top_k}, num_experts={routing.num_experts}; the model's routers have "
                f"top_k={self.routers[0].top_k}, num_experts={self.routers[0].num_experts}"
            )
        self.routing = routing
        self._cursor = 0

    @property
    def gate_functions(self) -> dict[int, str]:
        """Layer -> the gate function detected for its router (filled on each router's first call)."""
        return dict(self._gates)

    @property
    def fresh(self) -> Routing:
        return self._fresh.routing()

    def _begin(self, shape: tuple[int, int] | None) -> None:
        layout = current_layout()
        if layout is not None:  # a micro-batch: its positions say which records it replays
            self._start(layout.rows.shape, self.routing.gather(layout.rows, layout.positions))
            return
        routing = self.routing
        if shape is None:
            if routing.batch_size != 1:
                raise RoutingError(
                    "cannot read the [batch, seq] shape of this forward; pass input_ids or inputs_embeds"
                )
            shape = (1, routing.seq_len)
        b, s = shape
        total = routing.batch_size
        if b > total:
            raise RoutingError(f"forward over {b} rows, but the replayed routing has only {total} rows")
        if self._cursor + b > total:
            if self._cursor != total:
                raise RoutingError(
                    f"forward over {b} rows does not fit the {total - self._cursor} remaining rows of the routing"
                )
            self._cursor = 0
        part = routing.select(slice(self._cursor, self._cursor + b)).with_seq_len(s)
        self._cursor += b
        self._start((b, s), part)

    def _start(self, shape: tuple[int, int], part: Routing) -> None:
        b, s = shape
        self.calls += 1
        flat = part.indices.reshape(b * s, len(part.layers), part.top_k)
        valid = None if part.valid is None else part.valid.reshape(b * s)
        self._current = {layer: (flat[:, i], valid) for i, layer in enumerate(part.layers)}
        self._fresh.begin((b, s))

    def _replace(self, info: RouterInfo, output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, scores, fresh = check_output(info, output)
        if self._current is None:
            raise RoutingError(f"router {info.name} ran outside a forward pass of the model given to replay_routing")
        if info.layer not in self._current:  # a layer the routing leaves free routes afresh
            self._fresh.put(info.layer, fresh)
            return output
        recorded, valid = self._current[info.layer]
        if recorded.shape[0] != fresh.shape[0]:
            raise RoutingError(
                f"router {info.name} routed {fresh.shape[0]} tokens, the replayed routing has {recorded.shape[0]}"
            )
        gate = self._gates.get(info.layer)
        if gate is None:
            gate = self._gates[info.layer] = detect_gate(info, logits, scores, fresh)
        self._fresh.put(info.layer, fresh)
        recorded = recorded.to(device=fresh.device, dtype=fresh.dtype)
        if valid is not None:
            recorded = torch.where(valid.to(fresh.device).unsqueeze(-1), recorded, fresh)
        weights = gate_weights(gate, logits.reshape(-1, logits.shape[-1]), recorded.long(), scores.dtype)
        return logits, weights.reshape(scores.shape), recorded.reshape(fresh.shape)

    def attach(self) -> RoutingReplay:
        def pre(_module, args, kwargs):
            self._begin(input_shape(args, kwargs))

        def post(_module, _args, _output):
            self._fresh.end()  # self._current stays: checkpoint recomputation in backward replays this call

        self._hooks.handles.append(self.model.register_forward_pre_hook(pre, with_kwargs=True))
        self._hooks.handles.append(self.model.register_forward_hook(post))
        for info in self.routers:

            def hook(_module, _args, output, info=info):
                return self._replace(info, output)

            # prepended: a recorder attached before or after sees the replayed experts
            self._hooks.handles.append(info.module.register_forward_hook(hook, prepend=True))
        return self

    def detach(self) -> None:
        self._hooks.remove()
        self._current = None

    def __enter__(self) -> RoutingReplay:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()


@contextmanager
def replay_routing(
    model: nn.Module,
    routing: Routing,
    routers: list[RouterInfo] | None = None,
    gates: dict[int, str] | None = None,
) -> Iterator[RoutingReplay]:
    """Inside the block every router of ``model`` uses the experts recorded in ``routing``.

    Per router call: ``indices = where(valid, recorded, fresh)``; ``scores`` = the router's gate function
    (detected on the first call; see :mod:`rlzoo.moe.gates`) applied to the *current* ``router_logits`` at those
    indices, so the result equals the router's own output whenever the recorded and fresh experts agree, and the
    router weight still receives gradient. The hooks are removed on exit. See :class:`RoutingReplay` for how
    forwards map onto the routing's rows.

    For a caller replaying many times on one model: ``routers`` (the model's :func:`require_routers`) skips finding
    them again, and ``gates`` (a dict kept between calls, filled per layer) skips detecting the gate functions again.
    """
    replay = RoutingReplay(model, routing, routers, gates)
    with replay:
        yield replay
