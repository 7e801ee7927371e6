"""Routing from vLLM's own ``routed_experts`` output (``routing_capture: vllm``, the default with CUDA).

vLLM's ``enable_return_routed_experts=True`` fills ``CompletionOutput.routed_experts`` (``[seq_len, decoder
layers, top_k]``); the MoE layers' columns are kept. vLLM requires its V2 model runner (Triton) and prefix caching
for it (its aux-output connector keeps routing per cached block), so prefix caching is switched on. The option is
fixed when the engine is built: turning recording on after start rebuilds the engine (allowed only before the
first weight sync). UNTESTED here: no GPU was available when this was written.
"""

from __future__ import annotations

from typing import Any

import torch

from rlzoo.engines.vllm.routing.base import RoutingCapture
from rlzoo.moe import RoutingError, index_dtype


class RoutedExpertsCapture(RoutingCapture):
    """vLLM's ``routed_experts`` per completion, restricted to the MoE layers."""

    name = "vllm"
    fixed_at_build = True

    def __init__(self) -> None:
        self.layout: dict[str, Any] | None = None  # layers, top_k, num_experts while recording

    def build_kwargs(self) -> dict[str, Any]:
        return dict(enable_return_routed_experts=True, enable_prefix_caching=True)

    def start(self, llm: Any) -> None:
        try:
            self.layout = llm.collective_rpc("rlzoo_moe_layout")[0]
        except RuntimeError as exc:
            raise RoutingError(str(exc)) from exc

    def stop(self, llm: Any) -> None:
        self.layout = None  # vLLM keeps returning routed experts; they are ignored

    def routing(self, request_id: str, completion: Any, n: int, sequence: list[int]) -> torch.Tensor:
        length = len(sequence) - 1
        routed = getattr(completion, "routed_experts", None)
        if routed is None or routed.shape[0] < length:
            raise RuntimeError(
                f"vLLM returned routed experts of shape {None if routed is None else routed.shape} for a sequence "
                f"of {length + 1} tokens (enable_return_routed_experts, prefix caching and the V2 model runner on?)"
            )
        layout = self.layout
        if layout is None:
            raise RuntimeError("vLLM routing capture: routing() while recording is off")
        routing = torch.as_tensor(routed[:length].astype("int64"))[:, layout["layers"]]
        return routing.to(index_dtype(layout["num_experts"]))
