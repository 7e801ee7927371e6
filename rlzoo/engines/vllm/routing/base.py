"""The interface both routing-capture strategies of the vllm rollout engine implement.

The engine chooses one strategy when it starts (:func:`rlzoo.engines.vllm.routing.routing_capture`) and calls, in
this order: :meth:`RoutingCapture.build_kwargs` (extra ``vllm.LLM`` options when the engine is built recording),
:meth:`~RoutingCapture.start` / :meth:`~RoutingCapture.stop` when recording is turned on / off, and around every
``llm.generate``: :meth:`~RoutingCapture.begin`, :meth:`~RoutingCapture.end`, then
:meth:`~RoutingCapture.routing` per sampled completion. A routing is ``[len(sequence) - 1, MoE layers, top_k]``
expert ids (:func:`rlzoo.moe.index_dtype`) over every position vLLM ran through the model (the last sampled token
never is).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch


class RoutingCapture:
    """How the vllm rollout engine records the experts of each generation (``Generation.routing``)."""

    #: the value of the engine's ``routing_capture`` parameter that selects this strategy
    name: ClassVar[str] = ""
    #: True when capture is an option of the built ``vllm.LLM``: turning it on later needs a rebuild
    fixed_at_build: ClassVar[bool] = False

    def build_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` keyword arguments the engine is built with while recording; raises if the config forbids it."""
        raise NotImplementedError

    def start(self, llm: Any) -> None:
        """Start recording on a built engine; :class:`rlzoo.moe.RoutingError` if its model has no fused-MoE layer."""
        raise NotImplementedError

    def stop(self, llm: Any) -> None:
        """Stop recording (no cost while off)."""
        raise NotImplementedError

    def begin(self, llm: Any) -> None:
        """Before ``llm.generate``."""

    def end(self, llm: Any) -> None:
        """After ``llm.generate``: collect what the call recorded."""

    def routing(self, request_id: str, completion: Any, n: int, sequence: list[int]) -> torch.Tensor:
        """The routing of ``completion`` (sample ``completion.index`` of ``n`` of request ``request_id``) over
        ``sequence[:-1]`` (``sequence`` = prompt + response token ids)."""
        raise NotImplementedError
