"""Routing Replay for mixture-of-experts models: record the experts a forward pass used, replay them later.

Public API (no global patching: every hook is registered on one module *instance* and removed on exit):

- :func:`find_routers` — the model's MoE routers, keyed by decoder-layer index.
- :func:`record_routing` — ``with record_routing(model) as routing: model(...)``; afterwards ``routing`` is a
  :class:`Routing` holding the top-k expert indices of every (row, position, MoE layer).
- :func:`replay_routing` — ``with replay_routing(model, routing) as replay: model(...)``: every router returns the
  recorded experts; the gate weights are the *current* router's softmax (fp32) gathered at those experts and
  renormalised exactly as the model does, so the router still receives gradient. ``replay.fresh`` is the
  routing the current router would have chosen (for the ``moe/flip_rate`` metric).
- :func:`flip_rate` — share of (token, layer, k) slots whose expert differs between two routings.
- :func:`routing_for_batch` — rollout-engine routings (``Generation.routing``) aligned with a
  :class:`~rlzoo.engines.base.TokenBatch`, for Rollout Routing Replay (R3).

The router contract
-------------------
A router is a module whose forward returns ``(router_logits [N, E], scores [N, k], indices [N, k])`` for the
``N = B*S`` flattened tokens of a ``[B, S]`` forward, and whose block then runs the experts with ``indices`` and
``scores``. transformers 5.x implements this in ``*TopKRouter`` (``model.layers.i.mlp.gate``; GPT-OSS:
``mlp.router``). Any module with the same contract works, e.g. a DeepSpeed-MoE conversion that keeps an HF-style
``mlp.gate``. Replay recomputes the scores from ``router_logits`` with one of these gate functions, chosen per
router on its first call by checking which one reproduces the router's own scores bit for bit (an error names
the router if none does, e.g. sigmoid / bias-corrected / grouped routers):

- ``softmax-topk-renorm``: ``p = softmax(logits, fp32)``; ``g = p[idx] / sum(p[idx])`` (Qwen2/3-MoE with
  ``norm_topk_prob``, Mixtral, OLMoE with ``norm_topk_prob``, FlexOlmo, MiniMax, Qwen3-Next / Qwen3.5-MoE / Qwen3-VL-MoE)
- ``softmax-topk``: ``g = p[idx]`` (the same routers with ``norm_topk_prob=False``; OLMoE's default)
- ``topk-softmax``: ``g = softmax(logits[idx])`` (GPT-OSS)

Positions and layers
--------------------
Records are keyed by decoder-layer index (parsed from the module path ``...layers.<i>...``), never by call order,
so gradient-checkpointing recomputation during backward replays the right layer. A root forward pre-hook reads
the ``[B, S]`` shape of each forward. :class:`Routing` stores ``[B, S, L, k]`` indices (``L`` = MoE layers in
layer order) compactly — ``uint8`` when the model has at most 256 experts, else ``int16`` — plus an optional
``valid [B, S]`` mask: positions marked invalid are routed afresh by the current router during replay.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "RouterInfo",
    "Routing",
    "RoutingError",
    "RoutingRecorder",
    "RoutingReplay",
    "find_routers",
    "flip_counts",
    "flip_rate",
    "index_dtype",
    "record_routing",
    "replay_routing",
    "routing_for_batch",
]


class RoutingError(RuntimeError):
    """A model's routers do not fit the contract, or a routing does not fit the forward pass it is replayed in."""


# -- finding routers ---------------------------------------------------------------------------------------------

_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class RouterInfo:
    layer: int  # decoder-layer index
    name: str  # qualified module name, e.g. "model.layers.3.mlp.gate"
    module: nn.Module
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
    the index of their position in module order.
    """
    found: list[tuple[int, str, nn.Module]] = []
    for position, (name, module) in enumerate(model.named_modules()):
        if not _is_router(name, module):
            continue
        match = None
        for match in _LAYER_RE.finditer(name):
            pass  # the innermost "layers.<i>" wins
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


def _routers(model: nn.Module) -> list[RouterInfo]:
    routers = find_routers(model)
    if not routers:
        raise RoutingError(f"{type(model).__name__} has no MoE router (no module named gate/router with top_k)")
    if len({r.top_k for r in routers}) != 1 or len({r.num_experts for r in routers}) != 1:
        raise RoutingError("routers differ in top_k or num_experts; Routing assumes one [layers, top_k] layout")
    return routers


def index_dtype(num_experts: int) -> torch.dtype:
    """The compact dtype that stores expert indices ``0..num_experts-1``."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 32768:
        return torch.int16
    return torch.int32


# -- the routing record ------------------------------------------------------------------------------------------


class Routing:
    """Top-k expert indices ``[B, S, L, k]`` of a batch, plus which ``[B, S]`` positions carry a record.

    ``layers`` are the decoder-layer indices of the ``L`` MoE layers. ``valid`` is ``None`` when every position
    has a record; otherwise replay routes the invalid positions afresh. Row selection (``routing[rows]`` or
    :meth:`select`) gives a minibatch's slice, aligned with ``rlzoo.engines.tokens.select_rows``.
    """

    def __init__(
        self,
        indices: torch.Tensor,
        layers: Sequence[int],
        num_experts: int,
        valid: torch.Tensor | None = None,
    ) -> None:
        if indices.dim() != 4:
            raise ValueError(f"routing indices must be [B, S, layers, top_k], got {tuple(indices.shape)}")
        if indices.shape[2] != len(layers):
            raise ValueError(f"indices have {indices.shape[2]} layers but {len(layers)} layer ids were given")
        if valid is not None:
            valid = valid.to(torch.bool)
            if tuple(valid.shape) != tuple(indices.shape[:2]):
                raise ValueError(f"valid {tuple(valid.shape)} does not match indices {tuple(indices.shape[:2])}")
            if bool(valid.all()):
                valid = None
        self.indices = indices.to(index_dtype(num_experts))
        self.layers = tuple(int(x) for x in layers)
        self.num_experts = int(num_experts)
        self.valid = valid

    @classmethod
    def empty(cls, layers: Sequence[int], num_experts: int, top_k: int) -> Routing:
        return cls(torch.zeros((0, 0, len(layers), top_k), dtype=index_dtype(num_experts)), layers, num_experts)

    # shape ---------------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.indices.shape)  # type: ignore[return-value]

    @property
    def batch_size(self) -> int:
        return self.indices.shape[0]

    @property
    def seq_len(self) -> int:
        return self.indices.shape[1]

    @property
    def top_k(self) -> int:
        return self.indices.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes held by the indices and the valid mask."""
        size = self.indices.numel() * self.indices.element_size()
        if self.valid is not None:
            size += self.valid.numel() * self.valid.element_size()
        return size

    def valid_mask(self) -> torch.Tensor:
        """``[B, S]`` bool: positions that carry a record."""
        if self.valid is None:
            return torch.ones(self.indices.shape[:2], dtype=torch.bool, device=self.indices.device)
        return self.valid

    # selection -----------------------------------------------------------------------------------------------
    def select(self, rows: torch.Tensor | slice | Sequence[int] | int) -> Routing:
        """The routing of a subset of rows (a minibatch), in the given order."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        elif not isinstance(rows, slice | torch.Tensor):
            rows = torch.as_tensor(list(rows), dtype=torch.long)
        if isinstance(rows, torch.Tensor):
            rows = rows.to(self.indices.device)
        valid = None if self.valid is None else self.valid[rows]
        return Routing(self.indices[rows], self.layers, self.num_experts, valid)

    __getitem__ = select

    def only_layers(self, layers: Sequence[int]) -> Routing:
        """The routing of a subset of the MoE layers (decoder-layer indices); replaying it leaves the others free."""
        missing = [layer for layer in layers if layer not in self.layers]
        if missing:
            raise ValueError(f"layers {missing} are not in this routing (layers {self.layers})")
        columns = [self.layers.index(layer) for layer in layers]
        return Routing(self.indices[:, :, columns], layers, self.num_experts, self.valid)

    def to(self, device: torch.device | str) -> Routing:
        valid = None if self.valid is None else self.valid.to(device)
        return Routing(self.indices.to(device), self.layers, self.num_experts, valid)

    def with_seq_len(self, seq_len: int) -> Routing:
        """Cut or right-pad (with invalid positions) to ``seq_len`` columns."""
        width = self.seq_len
        if seq_len == width:
            return self
        if seq_len < width:
            valid = None if self.valid is None else self.valid[:, :seq_len]
            return Routing(self.indices[:, :seq_len], self.layers, self.num_experts, valid)
        pad = seq_len - width
        b, _, L, k = self.indices.shape
        indices = torch.cat([self.indices, self.indices.new_zeros((b, pad, L, k))], dim=1)
        valid = torch.cat([self.valid_mask(), self.indices.new_zeros((b, pad), dtype=torch.bool)], dim=1)
        return Routing(indices, self.layers, self.num_experts, valid)

    @classmethod
    def cat(cls, parts: Sequence[Routing]) -> Routing:
        """Concatenate rows; narrower parts are right-padded with invalid positions."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        if any(p.layers != first.layers or p.num_experts != first.num_experts or p.top_k != first.top_k for p in parts):
            raise ValueError("routings of different models cannot be concatenated")
        width = max(p.seq_len for p in parts)
        padded = [p.with_seq_len(width) for p in parts]
        indices = torch.cat([p.indices for p in padded], dim=0)
        if all(p.valid is None for p in padded):
            return cls(indices, first.layers, first.num_experts)
        return cls(indices, first.layers, first.num_experts, torch.cat([p.valid_mask() for p in padded], dim=0))

    def _assign(self, other: Routing) -> None:
        self.indices, self.layers, self.num_experts, self.valid = other.indices, other.layers, other.num_experts, other.valid

    def __repr__(self) -> str:
        covered = "all" if self.valid is None else f"{int(self.valid.sum())}/{self.valid.numel()}"
        return (
            f"Routing(shape={self.shape}, layers={self.layers}, num_experts={self.num_experts}, "
            f"dtype={self.indices.dtype}, valid={covered}, nbytes={self.nbytes})"
        )


# -- hooks -------------------------------------------------------------------------------------------------------


def _input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return int(value.shape[0]), int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[0]), int(args[0].shape[1])
    return None


def _check_output(info: RouterInfo, output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


class _Calls:
    """Per root-forward bookkeeping shared by recorder and replay: the current call's shape and layer records."""

    def __init__(self, routers: list[RouterInfo]) -> None:
        self.routers = routers
        self.layers = tuple(r.layer for r in routers)
        self.num_experts = routers[0].num_experts
        self.top_k = routers[0].top_k
        self.active: dict[int, torch.Tensor] | None = None  # layer -> [N, k], during a root forward
        self.shape: tuple[int, int] | None = None
        self.calls: list[Routing] = []

    def begin(self, shape: tuple[int, int] | None) -> None:
        self.active = {}
        self.shape = shape

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
        return routing


class _Hooks:
    def __init__(self) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()


class RoutingRecorder:
    """Records the top-k experts of every forward pass of ``model`` while attached (a context manager).

    ``calls`` holds one :class:`Routing` per root forward (e.g. a prefill and then one per decode step in
    generation); :meth:`routing` concatenates them as rows of one batch (a forward split into micro-batches).
    Router calls outside a root forward (gradient-checkpointing recomputation in backward) are ignored.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.routers = _routers(model)
        self._calls = _Calls(self.routers)
        self._hooks = _Hooks()
        self.on_call: Any = None  # optional callback(Routing) after each root forward

    @property
    def layers(self) -> tuple[int, ...]:
        return self._calls.layers

    @property
    def calls(self) -> list[Routing]:
        return self._calls.calls

    def routing(self) -> Routing:
        if not self.calls:
            return Routing.empty(self.layers, self._calls.num_experts, self._calls.top_k)
        return self.calls[0] if len(self.calls) == 1 else Routing.cat(self.calls)

    def attach(self) -> RoutingRecorder:
        calls = self._calls

        def pre(_module, args, kwargs):
            calls.begin(_input_shape(args, kwargs))

        def post(_module, _args, _output):
            routing = calls.end()
            if routing is not None and self.on_call is not None:
                self.on_call(routing)

        self._hooks.handles.append(self.model.register_forward_pre_hook(pre, with_kwargs=True))
        self._hooks.handles.append(self.model.register_forward_hook(post))
        for info in self.routers:

            def hook(_module, _args, output, info=info):
                calls.put(info.layer, _check_output(info, output)[2])

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
def record_routing(model: nn.Module) -> Iterator[Routing]:
    """Record the experts of every forward pass inside the block into the yielded :class:`Routing`.

    The yielded object is filled in place after each forward; several forwards (micro-batches) are concatenated
    as rows, padded on the right with invalid positions to the widest. Indices stay on the router's device.
    """
    routing = Routing.empty(*_layout(model))
    recorder = RoutingRecorder(model)
    recorder.on_call = lambda _r: routing._assign(recorder.routing())
    with recorder:
        yield routing


def _layout(model: nn.Module) -> tuple[tuple[int, ...], int, int]:
    routers = _routers(model)
    return tuple(r.layer for r in routers), routers[0].num_experts, routers[0].top_k


# -- replay ------------------------------------------------------------------------------------------------------

GATE_FUNCTIONS = ("softmax-topk-renorm", "softmax-topk", "topk-softmax")


def _gate(kind: str, logits: torch.Tensor, indices: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if kind == "topk-softmax":
        return torch.softmax(logits.gather(-1, indices), dim=-1, dtype=logits.dtype).to(out_dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights = probs.gather(-1, indices)
    if kind == "softmax-topk-renorm":
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(out_dtype)


def _detect_gate(info: RouterInfo, logits: torch.Tensor, scores: torch.Tensor, indices: torch.Tensor) -> str:
    """The gate function that reproduces this router's own scores from its logits and indices."""
    with torch.no_grad():
        logits2d = logits.reshape(-1, logits.shape[-1])
        # in bf16 two gate functions can round to the same scores on one batch: try the model's own first
        norm = getattr(info.module, "norm_topk_prob", None)
        preferred = "softmax-topk" if norm is False else "topk-softmax" if "GptOss" in type(info.module).__name__ else None
        order = list(GATE_FUNCTIONS)
        if preferred is not None:
            order.remove(preferred)
            order.insert(0, preferred)
        candidates = {kind: _gate(kind, logits2d, indices.long(), scores.dtype) for kind in order}
        for kind in order:
            if torch.equal(candidates[kind], scores.reshape(candidates[kind].shape)):
                return kind
        tol = dict(rtol=1e-3, atol=1e-5) if scores.dtype == torch.float32 else dict(rtol=2e-2, atol=1e-3)
        for kind in order:
            if torch.allclose(candidates[kind].float(), scores.reshape(candidates[kind].shape).float(), **tol):
                return kind
    raise RoutingError(
        f"router {info.name} ({type(info.module).__name__}) computes its gate weights with none of "
        f"{GATE_FUNCTIONS} (e.g. a sigmoid or bias-corrected router); Routing Replay cannot reproduce it"
    )


class RoutingReplay:
    """While attached, every router of ``model`` in ``routing.layers`` returns the experts of ``routing`` (see
    :func:`replay_routing`); routers of other layers route afresh.

    Forward passes consume rows of ``routing`` in order: a forward over ``B`` rows takes the next ``B`` rows
    (all of them when ``B`` equals the routing's batch size), wrapping around at the end, so an engine that splits
    a minibatch into contiguous micro-batches (forward + backward each, in order) is replayed correctly. Use
    :meth:`set` to switch to another routing between forwards. A forward narrower than the routing uses its
    first columns; a wider one routes the extra columns afresh.

    ``fresh`` collects, per forward (rows concatenated), the experts the current router would have chosen itself;
    ``flip_rate(routing, replay.fresh, mask)`` is the expert flip rate that replay removed.
    """

    def __init__(self, model: nn.Module, routing: Routing) -> None:
        self.model = model
        self.routers = _routers(model)
        self._fresh = _Calls(self.routers)
        self._hooks = _Hooks()
        self._gates: dict[int, str] = {}
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
        if not self._fresh.calls:
            return Routing.empty(self._fresh.layers, self._fresh.num_experts, self._fresh.top_k)
        return self._fresh.calls[0] if len(self._fresh.calls) == 1 else Routing.cat(self._fresh.calls)

    def _begin(self, shape: tuple[int, int] | None) -> None:
        routing = self.routing
        if shape is None:
            if routing.batch_size != 1:
                raise RoutingError("cannot read the [batch, seq] shape of this forward; pass input_ids or inputs_embeds")
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
        self.calls += 1
        flat = part.indices.reshape(b * s, len(part.layers), part.top_k)
        valid = None if part.valid is None else part.valid.reshape(b * s)
        self._current = {layer: (flat[:, i], valid) for i, layer in enumerate(part.layers)}
        self._fresh.begin((b, s))

    def _replace(self, info: RouterInfo, output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, scores, fresh = _check_output(info, output)
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
            gate = self._gates[info.layer] = _detect_gate(info, logits, scores, fresh)
        self._fresh.put(info.layer, fresh)
        recorded = recorded.to(device=fresh.device, dtype=fresh.dtype)
        if valid is not None:
            recorded = torch.where(valid.to(fresh.device).unsqueeze(-1), recorded, fresh)
        weights = _gate(gate, logits.reshape(-1, logits.shape[-1]), recorded.long(), scores.dtype)
        return logits, weights.reshape(scores.shape), recorded.reshape(fresh.shape)

    def attach(self) -> RoutingReplay:
        def pre(_module, args, kwargs):
            self._begin(_input_shape(args, kwargs))

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
def replay_routing(model: nn.Module, routing: Routing) -> Iterator[RoutingReplay]:
    """Inside the block every router of ``model`` uses the experts recorded in ``routing``.

    Per router call: ``indices = where(valid, recorded, fresh)``; ``scores`` = the router's gate function
    (detected on the first call; see the module docstring) applied to the *current* ``router_logits`` at those
    indices, so the result equals the router's own output whenever the recorded and fresh experts agree, and the
    router weight still receives gradient. The hooks are removed on exit. See :class:`RoutingReplay` for how
    forwards map onto the routing's rows.
    """
    replay = RoutingReplay(model, routing)
    with replay:
        yield replay


# -- metrics -----------------------------------------------------------------------------------------------------


def flip_rate(a: Routing, b: Routing, token_mask: torch.Tensor | None = None) -> float:
    """Share of (token, layer, k) slots of ``a`` whose expert is not among ``b``'s experts for that token and layer.

    Experts are compared as *sets* per (token, layer): the top-k order is not meaningful (``torch.topk`` orders by
    score, and two nearly equal scores may swap without changing the computation). With ``k`` distinct experts on
    both sides the measure is symmetric. Counted over tokens where ``token_mask [B, S]`` (default: all) is
    non-zero and both routings carry a record; 0.0 when no slot is counted. Routings of different width are
    compared over their common columns.
    """
    differ, total = flip_counts(a, b, token_mask)
    return differ / total if total else 0.0


def flip_counts(a: Routing, b: Routing, token_mask: torch.Tensor | None = None) -> tuple[int, int]:
    """``(slots that differ, slots counted)`` behind :func:`flip_rate` (counts add up across layers and passes)."""
    if a.layers != b.layers or a.top_k != b.top_k or a.batch_size != b.batch_size:
        raise ValueError(f"routings do not match: {a!r} vs {b!r}")
    width = min(a.seq_len, b.seq_len)
    device = a.indices.device
    mask = a.valid_mask()[:, :width] & b.valid_mask()[:, :width].to(device)
    if token_mask is not None:
        mask = mask & (token_mask[:, :width].to(device) != 0)
    ia = a.indices[:, :width][mask]
    ib = b.indices[:, :width].to(device)[mask]
    differ = 0
    for start in range(0, ia.shape[0], 16384):  # [M, L, k, k] comparisons, chunked over tokens
        x = ia[start : start + 16384].long()
        y = ib[start : start + 16384].long()
        differ += int((~(x.unsqueeze(-1) == y.unsqueeze(-2)).any(-1)).sum())
    return differ, ia.numel()


# -- rollout routings (R3) ---------------------------------------------------------------------------------------


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
        model_layers, model_experts, _ = _layout(model)
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
