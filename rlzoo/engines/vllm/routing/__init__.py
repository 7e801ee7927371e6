"""Routing capture of the vllm rollout engine (Rollout Routing Replay): two strategies behind one interface.

- :class:`~rlzoo.engines.vllm.routing.worker.WorkerCapture` (``routing_capture: worker``, the default on CPU):
  capture hooks in vLLM's worker (:mod:`rlzoo.engines.vllm.routing.hooks`); prefix caching off.
- :class:`~rlzoo.engines.vllm.routing.routed_experts.RoutedExpertsCapture` (``routing_capture: vllm``, the default
  with CUDA): vLLM's own ``routed_experts`` output; prefix caching on, fixed when the engine is built.

Both implement :class:`~rlzoo.engines.vllm.routing.base.RoutingCapture`; :func:`routing_capture` picks one when
the engine starts. Nothing here imports vllm at import time.
"""

from __future__ import annotations

from typing import Literal

from rlzoo.engines.vllm.routing.base import RoutingCapture
from rlzoo.engines.vllm.routing.routed_experts import RoutedExpertsCapture
from rlzoo.engines.vllm.routing.worker import WorkerCapture

__all__ = ["RoutedExpertsCapture", "RoutingCapture", "WorkerCapture", "routing_capture"]


def routing_capture(
    mode: Literal["auto", "worker", "vllm"], on_cuda: bool, enable_prefix_caching: bool
) -> RoutingCapture:
    """The strategy for the engine's ``routing_capture`` parameter; ``auto``: ``vllm`` with CUDA, else ``worker``."""
    if mode == "auto":
        mode = "vllm" if on_cuda else "worker"
    if mode == "worker":
        return WorkerCapture(enable_prefix_caching)
    return RoutedExpertsCapture()
