"""Code that runs inside vLLM's worker, next to the model (``LLM(worker_extension_cls=...)``).

vLLM mixes this class into its worker class; ``llm.collective_rpc("rlzoo_...", ...)`` calls these methods with
``self`` = the worker (``self.model_runner.model`` is vLLM's model). This module must not import vllm at import
time of ``rlzoo.engines`` (it is only named by string), but it may import vllm freely inside the methods.

Routing capture (Rollout Routing Replay on CPU, where vLLM's own ``enable_return_routed_experts`` is unavailable:
it needs the V2 model runner, which needs Triton). Hooked vLLM 0.32 API, all on the V1 model runner:

- every fused-MoE layer is a ``vllm.model_executor.layers.fused_moe.runner.moe_runner.MoERunner`` with a
  ``layer_id`` (decoder-layer index) and a ``router`` (``router.base_router.BaseRouter``);
  ``router.set_capture_fn(fn)`` makes ``BaseRouter._select_experts`` call ``fn(topk_ids)`` with the logical
  top-k expert ids ``[num_tokens, top_k]`` of every forward (``set_capture_fn(None)`` removes it) — the same hook
  vLLM's own ``bind_routed_experts_capturer`` uses;
- ``model_runner._model_forward(input_ids=..., positions=..., ...)`` runs the model once per scheduler step; it is
  wrapped on the instance while recording. At that point the persistent batch is final for the step:
  ``input_batch.req_ids[:input_batch.num_reqs]`` is the request order of the flattened token rows and
  ``query_start_loc.np[:num_reqs + 1]`` their offsets (request ``i`` owns rows ``qsl[i]:qsl[i+1]``, i.e. its
  ``num_scheduled_tokens``), and ``positions[row]`` is the token's position in its sequence
  (``num_computed_tokens + offset``), so chunked prefill and preemption-recompute land on the right positions.

Each step's rows are kept as they come (request, position, the token id fed there, top-k ids) and sorted into
per-request segments when the engine takes them (a position computed twice keeps the later computation); the token
ids let the engine check that a segment belongs to the generation it is attached to. Prefix caching must be off: a
cached prompt block is never run through the model, so its positions would have no record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch


# vLLM 0.32 ``model_executor/model_loader/reload/layerwise.py``, ``finalize_layerwise_processing``
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_RELOAD_FAILED = "%s: Failed to load weights"


def _derived_only_layers(model: torch.nn.Module) -> set[str]:
    """Class names of the layers whose every tensor is a non-persistent buffer (no parameter, nothing persistent).

    Such a buffer is computed by the layer itself (``RotaryEmbedding.cos_sin_cache`` from the rope settings) and is in
    no checkpoint, so no weight sync can ever carry it.
    """
    derived, loadable = set(), set()
    for module in model.modules():
        params = [p for p in module._parameters.values() if p is not None]
        buffers = [name for name, b in module._buffers.items() if b is not None]
        if not params and not buffers:
            continue
        if not params and all(name in module._non_persistent_buffers_set for name in buffers):
            derived.add(type(module).__name__)
        else:
            loadable.add(type(module).__name__)
    return derived - loadable


class _NoFalseReloadAlarm(logging.Filter):
    """Drops vLLM's ``<Layer>: Failed to load weights`` warning for layers that hold only derived buffers.

    Why it is a false alarm: vLLM's layerwise reload counts every parameter *and buffer* of a layer as loadable
    (``get_layer_size``) and warns when a layer received none of them; it then puts the layer's existing tensors back
    (``_place_kernel_tensors``), which for a derived buffer is exactly right. ``RotaryEmbedding`` holds only
    ``cos_sin_cache`` (non-persistent, in no checkpoint), so every reload warned once per sync (about 600 lines in a
    600-step run). Every weight we send does arrive: vLLM's own check of parameters left unloaded
    (``Following weights were not loaded from checkpoint``) stays on, and so does this warning for any layer with a
    parameter or persistent buffer.
    """

    def __init__(self, layer_names: set[str]) -> None:
        super().__init__()
        self.layer_names = layer_names

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _RELOAD_FAILED and record.args and record.args[0] in self.layer_names)


@contextlib.contextmanager
def _no_false_reload_alarm(model: torch.nn.Module) -> Iterator[None]:
    """While reloading: silence :class:`_NoFalseReloadAlarm`'s false alarm, and only that."""
    reload_logger = logging.getLogger(_RELOAD_LOGGER)
    alarm_filter = _NoFalseReloadAlarm(_derived_only_layers(model))
    reload_logger.addFilter(alarm_filter)
    try:
        yield
    finally:
        reload_logger.removeFilter(alarm_filter)


class RlzooWorkerExtension:
    """Weight sync for :class:`rlzoo.engines.vllm_rollout.VLLMRolloutEngine`."""

    def rlzoo_load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], repack_moe: bool = True
    ) -> dict[str, int]:
        """Load checkpoint-format (Hugging Face, per-expert) weights in place, then re-pack CPU MoE experts.

        ``repack_moe=False`` leaves out the re-pack: only for tests that show why it is needed.
        """
        model = self.model_runner.model  # type: ignore[attr-defined]
        with _no_false_reload_alarm(model):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return {"repacked_moe_layers": self.rlzoo_repack_cpu_moe() if repack_moe else 0}

    @torch.no_grad()
    def rlzoo_repack_cpu_moe(self) -> int:
        """Re-apply the CPU grouped-GEMM prepack to every fused-MoE layer's freshly reloaded expert weights.

        vLLM 0.32 on CPU: ``UnquantizedFusedMoEMethod._setup_kernel`` runs the experts' own
        ``process_weights_after_loading`` (which pads the intermediate size and calls
        ``cpu_prepack_moe_weight(weight, isa)``) only when its ``moe_kernel`` does not exist yet, i.e. on the first
        load. After ``reload_weights`` the layer holds the new weights in checkpoint layout while the kernel reads
        them as prepacked, silently computing with scrambled experts (|dlogp| ~ 1). Here the prepack is re-applied in
        place (same storage, so nothing that captured the tensors goes stale). Returns the number of layers done.
        """
        if self.device.type != "cpu":  # type: ignore[attr-defined]
            return 0  # GPU kernels re-shuffle weights correctly on reload
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        count = 0
        for module in self.model_runner.model.modules():  # type: ignore[attr-defined]
            quant_method = getattr(module, "quant_method", None)
            kernel = getattr(quant_method, "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if experts is None or not hasattr(module, "w13_weight"):
                continue
            if not isinstance(experts, CPUUnquantizedExperts):
                raise NotImplementedError(
                    f"weight sync into {type(experts).__name__} MoE experts on CPU is not supported "
                    "(only unquantized experts are re-packed after a reload)"
                )
            if getattr(experts, "_use_zentorch", False):
                continue  # zentorch reads the plain layout: nothing was packed
            moe_config = experts.moe_config
            if experts._padded_intermediate_size(moe_config) != moe_config.intermediate_size_per_partition:
                raise NotImplementedError(
                    f"MoE intermediate size {moe_config.intermediate_size_per_partition} is padded by vLLM's CPU "
                    f"kernel (to a multiple of {experts._intermediate_alignment()}); weight sync needs an unpadded "
                    "size: choose moe_intermediate_size as a multiple of 32"
                )
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name)
                weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
            count += 1
        return count

    def rlzoo_num_moe_layers(self) -> int:
        """How many fused-MoE layers vLLM's model has (a test hook)."""
        return sum(
            1
            for m in self.model_runner.model.modules()  # type: ignore[attr-defined]
            if getattr(getattr(m, "quant_method", None), "moe_kernel", None) is not None
        )

    # ------------------------------------------------------------------ routing capture (R3)
    def rlzoo_routing_start(self) -> dict[str, Any]:
        """Install a capture function on every fused-MoE router and wrap the model runner's forward.

        Returns the layout: ``layers`` (decoder-layer indices of the MoE layers, ascending), ``top_k`` and
        ``num_experts``. Idempotent.
        """
        capture = getattr(self, "_rlzoo_capture", None)
        if capture is None:
            capture = _RoutingCapture(self.model_runner)  # type: ignore[attr-defined]
            capture.attach()
            self._rlzoo_capture = capture
        return capture.layout()

    def rlzoo_moe_layout(self) -> dict[str, Any]:
        """The MoE layout without installing anything: ``layers`` (decoder-layer indices), ``top_k``,
        ``num_experts`` (for vLLM's own routed-experts output, whose layer axis is every decoder layer)."""
        runners = _moe_runners(self.model_runner.model)  # type: ignore[attr-defined]
        if not runners:
            raise RuntimeError("vLLM's model has no fused-MoE layer: nothing to record routing of")
        router = runners[0][1].router
        return {
            "layers": [layer for layer, _ in runners],
            "top_k": int(router.top_k),
            "num_experts": int(router.global_num_experts),
        }

    def rlzoo_routing_stop(self) -> None:
        """Remove the capture functions and the forward wrapper; drop any records not taken."""
        capture = getattr(self, "_rlzoo_capture", None)
        if capture is not None:
            capture.detach()
            self._rlzoo_capture = None

    def rlzoo_routing_clear(self) -> None:
        capture = getattr(self, "_rlzoo_capture", None)
        if capture is not None:
            capture.clear()

    def rlzoo_routing_take(self, to_file: str | None = None) -> dict[str, Any]:
        """Hand over (and forget) what was recorded since the last take / clear, one segment per request:
        ``req_ids`` (list), ``offsets [R+1]`` (request ``r`` owns rows ``offsets[r]:offsets[r+1]``), and per row
        ``positions [T]`` (ascending and unique within a request), ``tokens [T]`` (the token fed there, -1 if
        unknown) and ``routing [T, L, k]`` (top-k expert ids of the MoE layers in layer order).

        ``to_file``: write the four tensors to this safetensors file instead and return ``req_ids`` and ``path``,
        for an engine core in another process (tensors do not pickle through ``collective_rpc`` there).
        """
        capture = getattr(self, "_rlzoo_capture", None)
        if capture is None:
            raise RuntimeError("rlzoo_routing_take() without rlzoo_routing_start()")
        taken = capture.take()
        if to_file is None:
            return taken
        from safetensors.torch import save_file

        req_ids = taken.pop("req_ids")
        save_file({key: t.contiguous() for key, t in taken.items()}, to_file)
        return {"req_ids": req_ids, "path": to_file}


def _moe_runners(model: torch.nn.Module) -> list[tuple[int, Any]]:
    """``(decoder-layer index, MoERunner)`` of every fused-MoE layer, ascending by layer."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners = [(int(m.layer_id), m) for m in model.modules() if isinstance(m, MoERunner)]
    layers = [layer for layer, _ in runners]
    if len(set(layers)) != len(layers):
        raise RuntimeError(f"several fused-MoE layers share a decoder-layer index: {sorted(layers)}")
    return sorted(runners, key=lambda t: t[0])


class _RoutingCapture:
    """Routing records of one worker: one entry per model step (request rows, positions, tokens, top-k ids)."""

    def __init__(self, model_runner: Any) -> None:
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        self.runner = model_runner
        for attr in ("input_batch", "query_start_loc", "_model_forward"):
            if not hasattr(model_runner, attr):
                raise NotImplementedError(
                    f"routing capture needs vLLM's V1 model runner ({type(model_runner).__name__} has no {attr!r}); "
                    "on GPU use vLLM's own enable_return_routed_experts instead"
                )
        self.runners = _moe_runners(model_runner.model)
        if not self.runners:
            raise RuntimeError("vLLM's model has no fused-MoE layer: nothing to record routing of")
        for _, runner in self.runners:
            if runner.is_monolithic or not isinstance(runner.router, BaseRouter):
                raise NotImplementedError(
                    f"routing capture through the router's capture function does not reach MoE layer "
                    f"{runner.layer_name} (monolithic kernel or router {type(runner.router).__name__})"
                )
        self.layers = [layer for layer, _ in self.runners]
        self.top_k = int(self.runners[0][1].router.top_k)
        self.num_experts = int(self.runners[0][1].router.global_num_experts)
        from rlzoo.moe import index_dtype

        self.dtype = index_dtype(self.num_experts)
        self.req_index: dict[str, int] = {}  # request id -> dense index, for the step records
        self.steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._step: torch.Tensor | None = None  # [tokens, L, k] of the forward in progress
        self._seen: list[bool] = []

    def layout(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "top_k": self.top_k, "num_experts": self.num_experts}

    def clear(self) -> None:
        self.req_index, self.steps = {}, []

    # hooks ---------------------------------------------------------------------------------------------------
    def attach(self) -> None:
        for column, (_, runner) in enumerate(self.runners):
            runner.router.set_capture_fn(lambda ids, column=column: self._capture(column, ids))
        original = self.runner._model_forward  # the bound class method

        def model_forward(*args: Any, **kwargs: Any) -> Any:
            return self._forward(original, args, kwargs)

        self.runner._model_forward = model_forward  # instance attribute shadows the class method

    def detach(self) -> None:
        for _, runner in self.runners:
            runner.router.set_capture_fn(None)
        self.runner.__dict__.pop("_model_forward", None)
        self.clear()
        self._step = None

    def _capture(self, column: int, topk_ids: torch.Tensor) -> None:
        step = self._step
        if step is None:  # a forward outside execute_model (warm-up / dummy run): nothing to record
            return
        n = step.shape[0]
        if topk_ids.shape[0] < n:
            raise RuntimeError(f"router of MoE column {column} routed {topk_ids.shape[0]} tokens, the step has {n}")
        step[:, column] = topk_ids[:n].to(device="cpu", dtype=step.dtype)
        self._seen[column] = True

    def _forward(self, original: Any, args: tuple, kwargs: dict) -> Any:
        runner = self.runner
        batch = runner.input_batch
        num_reqs = int(batch.num_reqs)
        starts = runner.query_start_loc.np[: num_reqs + 1]
        total = int(starts[-1])
        positions = kwargs.get("positions")
        input_ids = kwargs.get("input_ids")
        if positions is None or positions.dim() != 1:  # M-RoPE and the like: not supported
            raise NotImplementedError("routing capture needs 1-D token positions")
        index = self.req_index
        rows = np.fromiter((index.setdefault(r, len(index)) for r in batch.req_ids[:num_reqs]), np.int64, num_reqs)
        requests = torch.from_numpy(np.repeat(rows, np.diff(starts)))
        self._step = torch.zeros((total, len(self.layers), self.top_k), dtype=self.dtype)
        self._seen = [False] * len(self.layers)
        try:
            output = original(*args, **kwargs)
            step, seen = self._step, self._seen
        finally:
            self._step = None
        if not all(seen):
            missing = [layer for layer, ok in zip(self.layers, seen) if not ok]
            raise RuntimeError(f"routing capture: the routers of MoE layers {missing} did not run in this step")
        # copies: on CPU both are views of the runner's persistent buffers, overwritten by the next step
        positions = positions[:total].to("cpu", torch.int64, copy=True)
        if input_ids is None:
            tokens = torch.full((total,), -1, dtype=torch.int32)
        else:
            tokens = input_ids[:total].to("cpu", torch.int32, copy=True)
        self.steps.append((requests, positions, tokens, step))
        return output

    def take(self) -> dict[str, Any]:
        """Every request's rows, sorted by position; a position computed twice (preemption) keeps the later one."""
        steps, req_index = self.steps, self.req_index
        self.clear()
        if not steps:
            return {
                "req_ids": [],
                "offsets": torch.zeros(1, dtype=torch.int64),
                "positions": torch.zeros(0, dtype=torch.int64),
                "tokens": torch.zeros(0, dtype=torch.int32),
                "routing": torch.zeros((0, len(self.layers), self.top_k), dtype=self.dtype),
            }
        requests, positions, tokens, routing = (torch.cat(parts) for parts in zip(*steps))
        key = requests * (int(positions.max()) + 1) + positions
        order = torch.sort(key, stable=True).indices  # by request, then position, then step
        key = key[order]
        last = torch.ones_like(key, dtype=torch.bool)
        last[:-1] = key[1:] != key[:-1]  # the last (latest) row of each (request, position)
        order = order[last]
        counts = torch.bincount(requests[order], minlength=len(req_index))
        offsets = torch.zeros(len(req_index) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(counts, 0)
        req_ids = sorted(req_index, key=req_index.__getitem__)
        return {
            "req_ids": req_ids,
            "offsets": offsets,
            "positions": positions[order],
            "tokens": tokens[order],
            "routing": routing[order],
        }
