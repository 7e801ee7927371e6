"""Recording routing: the top-k experts every forward pass of a model used, as a :class:`Routing`.

No global patching: every hook is registered on one module *instance* and removed on exit. Records are keyed by
decoder-layer index; a recorder attached together with a replay records the experts actually used (the replayed
ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from rlzoo.moe.hooks import ForwardCalls, HookHandles, check_output, input_shape
from rlzoo.moe.routers import RouterInfo, layout_of, require_routers
from rlzoo.moe.routing import Routing


class RoutingRecorder:
    """Records the top-k experts of every forward pass of ``model`` while attached (a context manager).

    ``calls`` holds one :class:`Routing` per root forward (e.g. a prefill and then one per decode step in
    generation); :meth:`routing` concatenates them as rows of one batch (a forward split into micro-batches).
    Router calls outside a root forward (gradient-checkpointing recomputation in backward) are ignored.
    """

    def __init__(self, model: nn.Module, routers: list[RouterInfo] | None = None) -> None:
        self.model = model
        self.routers = require_routers(model) if routers is None else routers
        self._calls = ForwardCalls(self.routers)
        self._hooks = HookHandles()
        self.on_call: Any = None  # optional callback(Routing) after each root forward

    @property
    def layers(self) -> tuple[int, ...]:
        return self._calls.layers

    @property
    def calls(self) -> list[Routing]:
        return self._calls.calls

    def routing(self) -> Routing:
        return self._calls.routing()

    def attach(self) -> RoutingRecorder:
        calls = self._calls

        def pre(_module, args, kwargs):
            calls.begin(input_shape(args, kwargs))

        def post(_module, _args, _output):
            routing = calls.end()
            if routing is not None and self.on_call is not None:
                self.on_call(routing)

        self._hooks.handles.append(self.model.register_forward_pre_hook(pre, with_kwargs=True))
        self._hooks.handles.append(self.model.register_forward_hook(post))
        for info in self.routers:

            def hook(_module, _args, output, info=info):
                calls.put(info.layer, check_output(info, output)[2])

            # appended: runs after a replay hook on the same router, so it records the experts actually used
            self._hooks.handles.append(info.module.register_forward_hook(hook))
        return self

    def detach(self) -> None:
        self._hooks.remove()

    def __enter__(self) -> RoutingRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()


@contextmanager
def record_routing(model: nn.Module, routers: list[RouterInfo] | None = None) -> Iterator[Routing]:
    """Record the experts of every forward pass inside the block into the yielded :class:`Routing`.

    The yielded object is filled in place after each forward; several forwards (micro-batches) are concatenated
    as rows, padded on the right with invalid positions to the widest. Indices stay on the router's device.
    ``routers``: the model's :func:`require_routers`, when the caller already holds them (found afresh if not).
    """
    routers = require_routers(model) if routers is None else routers
    routing = Routing.empty(*layout_of(routers))
    recorder = RoutingRecorder(model, routers)
    recorder.on_call = lambda _r: routing._assign(recorder.routing())
    with recorder:
        yield routing
