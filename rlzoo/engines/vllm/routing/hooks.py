"""Routing capture inside vLLM's worker: the hooks behind ``routing_capture: worker`` (runs next to the model).

Installed and read through ``RlzooWorkerExtension`` (:mod:`rlzoo.engines.vllm.worker`); the engine's side is
:mod:`rlzoo.engines.vllm.routing.worker`. Imports vllm only inside functions.

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

from typing import Any

import numpy as np
import torch

from rlzoo.moe import index_dtype


def moe_runners(model: torch.nn.Module) -> list[tuple[int, Any]]:
    """``(decoder-layer index, MoERunner)`` of every fused-MoE layer, ascending by layer."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners = [(int(m.layer_id), m) for m in model.modules() if isinstance(m, MoERunner)]
    layers = [layer for layer, _ in runners]
    if len(set(layers)) != len(layers):
        raise RuntimeError(f"several fused-MoE layers share a decoder-layer index: {sorted(layers)}")
    return sorted(runners, key=lambda t: t[0])


class RouterCaptureHooks:
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
        self.runners = moe_runners(model_runner.model)
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
