"""Code that runs inside vLLM's worker, next to the model (``LLM(worker_extension_cls=...)``).

vLLM mixes this class into its worker class; ``llm.collective_rpc("rlzoo_...", ...)`` calls these methods with
``self`` = the worker (``self.model_runner.model`` is vLLM's model). This module must not import vllm at import
time of ``rlzoo.engines`` (it is only named by string), but it may import vllm freely inside the methods.

Routing capture (``routing_capture: worker``): the hooks live in :mod:`rlzoo.engines.vllm.routing.hooks`; the
``rlzoo_routing_*`` methods here install, read and remove them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rlzoo.engines.vllm.direct_sync import copy_weights
from rlzoo.engines.vllm.routing.hooks import RouterCaptureHooks, moe_runners

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


@torch.no_grad()
def repack_cpu_moe(model: torch.nn.Module, device: torch.device) -> int:
    """Re-apply the CPU grouped-GEMM prepack to every fused-MoE layer's freshly reloaded expert weights.

    vLLM 0.32 on CPU: ``UnquantizedFusedMoEMethod._setup_kernel`` runs the experts' own
    ``process_weights_after_loading`` (which pads the intermediate size and calls
    ``cpu_prepack_moe_weight(weight, isa)``) only when its ``moe_kernel`` does not exist yet, i.e. on the first
    load. After ``reload_weights`` the layer holds the new weights in checkpoint layout while the kernel reads
    them as prepacked, silently computing with scrambled experts (|dlogp| ~ 1). Here the prepack is re-applied in
    place (same storage, so nothing that captured the tensors goes stale). Returns the number of layers done. Also
    what rlzoo's gloo weight-transfer backend runs after each update (:mod:`rlzoo.engines.vllm_server.gloo_transfer`).
    """
    if device.type != "cpu":
        return 0  # GPU kernels re-shuffle weights correctly on reload
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    count = 0
    for module in model.modules():
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


class RlzooWorkerExtension:
    """Weight sync for :class:`rlzoo.engines.vllm.rollout.VLLMRolloutEngine`."""

    def rlzoo_load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], repack_moe: bool = True
    ) -> dict[str, int]:
        """The ``reload`` path: checkpoint-format (Hugging Face, per-expert) weights through vLLM's
        ``reload_weights``, then the CPU MoE re-pack.

        ``repack_moe=False`` leaves out the re-pack: only for tests that show why it is needed.
        """
        model = self.model_runner.model  # type: ignore[attr-defined]
        with _no_false_reload_alarm(model):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return {"repacked_moe_layers": self.rlzoo_repack_cpu_moe() if repack_moe else 0}

    def rlzoo_copy_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
        """The ``direct`` path: checkpoint-format weights copied into vLLM's fused tensors, then the CPU MoE re-pack
        (:mod:`rlzoo.engines.vllm.direct_sync`). Raises ``DirectSyncUnsupported`` before writing anything if the
        weights do not map onto the model."""
        copied = copy_weights(self.model_runner.model, weights)  # type: ignore[attr-defined]
        return {"copied_tensors": copied, "repacked_moe_layers": self.rlzoo_repack_cpu_moe()}

    def rlzoo_repack_cpu_moe(self) -> int:
        """Re-apply the CPU grouped-GEMM prepack to every fused-MoE layer (:func:`repack_cpu_moe`)."""
        return repack_cpu_moe(self.model_runner.model, self.device)  # type: ignore[attr-defined]

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
            capture = RouterCaptureHooks(self.model_runner)  # type: ignore[attr-defined]
            capture.attach()
            self._rlzoo_capture = capture
        return capture.layout()

    def rlzoo_moe_layout(self) -> dict[str, Any]:
        """The MoE layout without installing anything: ``layers`` (decoder-layer indices), ``top_k``,
        ``num_experts`` (for vLLM's own routed-experts output, whose layer axis is every decoder layer)."""
        runners = moe_runners(self.model_runner.model)  # type: ignore[attr-defined]
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
