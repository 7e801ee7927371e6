"""Routing capture in vLLM's worker (``routing_capture: worker``, the default on CPU), the engine's side.

A worker-extension hook (:mod:`rlzoo.engines.vllm.routing.hooks`, installed through
``RlzooWorkerExtension.rlzoo_routing_start``) puts a capture function on every fused-MoE router and maps each
step's rows to (request, position). Needs prefix caching off (a cached prompt block is never recomputed, so it
would have no routing): recording refuses to start with ``enable_prefix_caching: true``. Every one of the ``n``
samples of a prompt is its own vLLM request and prefills the prompt itself, so each carries its own prompt
routing. The hooks are removed when recording is turned off. In fp32 the captured experts equal those of a
transformers forward of the same weights, before and after a weight sync, with chunked prefill
(integration_tests/test_vllm_routing.py; measured agreement in docs/benchmarks.md).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import torch

from rlzoo.engines.vllm.routing.base import RoutingCapture
from rlzoo.errors import RlzooError
from rlzoo.moe import RoutingError


class WorkerCapture(RoutingCapture):
    """Capture hooks in vLLM's worker; records taken after every ``generate`` and matched to each completion."""

    name = "worker"

    def __init__(self, enable_prefix_caching: bool) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        self.layout: dict[str, Any] | None = None  # layers, top_k, num_experts while recording
        self.records: dict[str, Any] | None = None  # the last generate()'s records

    def _check_no_prefix_caching(self) -> None:
        if self.enable_prefix_caching:
            raise RlzooError(
                "the vllm rollout engine records routing (R3 / MoE diagnostics) only with prefix caching off: a "
                "cached prompt block is never run through the model, so its experts are unknown; set "
                "rollout.engine.enable_prefix_caching: false"
            )

    def build_kwargs(self) -> dict[str, Any]:
        self._check_no_prefix_caching()
        return {}

    def start(self, llm: Any) -> None:
        self._check_no_prefix_caching()
        try:
            self.layout = llm.collective_rpc("rlzoo_routing_start")[0]
        except RuntimeError as exc:
            raise RoutingError(str(exc)) from exc

    def stop(self, llm: Any) -> None:
        if self.layout is not None:
            llm.collective_rpc("rlzoo_routing_stop")
            self.layout = None

    def begin(self, llm: Any) -> None:
        llm.collective_rpc("rlzoo_routing_clear")  # nothing left over from an interrupted call
        self.records = None

    def end(self, llm: Any) -> None:
        self.records = self._take(llm)

    @staticmethod
    def in_process(llm: Any) -> bool:
        """Whether vLLM's engine core runs in this process (tensors can be handed over directly)."""
        return type(llm.llm_engine.engine_core).__name__ == "InprocClient"

    def _take(self, llm: Any) -> dict[str, Any]:
        """The worker's records (see ``RlzooWorkerExtension.rlzoo_routing_take``), plus ``index``: request id ->
        segment. In-process the tensors are handed over directly; otherwise through a file in /dev/shm."""
        if self.in_process(llm):
            taken = llm.collective_rpc("rlzoo_routing_take")[0]
        else:
            from safetensors.torch import load_file

            path = f"/dev/shm/rlzoo-routing-{os.getpid()}-{uuid.uuid4().hex[:8]}.safetensors"
            try:
                reply = llm.collective_rpc("rlzoo_routing_take", kwargs=dict(to_file=path))[0]
                taken = {"req_ids": reply["req_ids"], **load_file(path)}
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        index: dict[str, int] = {}
        for segment, req_id in enumerate(taken["req_ids"]):
            index[req_id] = segment
        for segment, req_id in enumerate(taken["req_ids"]):
            base = req_id.rsplit("-", 1)[0]  # without the 8 random characters vLLM appends
            if base != req_id:
                index[base] = segment if base not in index else -1  # -1: ambiguous
        taken["index"] = index
        taken["offsets"] = taken["offsets"].tolist()
        return taken

    def routing(self, request_id: str, completion: Any, n: int, sequence: list[int]) -> torch.Tensor:
        """The recorded segment of sample ``completion.index`` of request ``request_id`` over ``sequence[:-1]``.

        vLLM 0.32 names the request ``<external>-<8 random>`` (n = 1) or ``<sample>_<external>-<8 random>`` (n > 1,
        each sample its own request); the record's token ids are checked against the sequence, so a change in that
        naming fails loudly instead of attaching another sample's routing.
        """
        records = self.records
        if records is None:
            raise RuntimeError("vLLM routing capture: routing() before the records of a generate() were taken")
        sample = completion.index
        length = len(sequence) - 1
        segment = records["index"].get(request_id if n == 1 else f"{sample}_{request_id}", -1)
        if segment < 0:
            raise RuntimeError(f"vLLM routing capture: no single record for request {request_id!r} sample {sample}")
        lo, hi = records["offsets"][segment], records["offsets"][segment + 1]
        # positions are ascending and unique within a segment: 0 .. length-1 all present iff this holds
        positions = records["positions"]
        if hi - lo < length or (length > 0 and int(positions[lo + length - 1]) != length - 1):
            raise RuntimeError(
                f"vLLM routing capture covered {hi - lo} positions of a sequence that needs 0..{length - 1} "
                "(prefix caching on, or a step the capture did not see)"
            )
        tokens = records["tokens"][lo : lo + length].tolist()
        if tokens != sequence[:length] and any(t >= 0 and t != s for t, s in zip(tokens, sequence)):  # -1: unknown
            raise RuntimeError("vLLM routing capture: the record's tokens do not match the generated sequence")
        return records["routing"][lo : lo + length].clone()
