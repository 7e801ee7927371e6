"""What vLLM needs of the model and of the memory it is given: a head size it supports, a context within the model's
positions, a KV cache that holds one whole sequence; and the rollout memory it takes.

The vllm engine's start-up check (:meth:`rlzoo.engines.vllm.rollout.VLLMRolloutEngine.preflight`) and memory
estimate (``memory``, ``memory_hint``) are these rules applied to its options (:class:`rlzoo.engines.vllm.options.Params`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlzoo.config.base import DEFAULT_ROLLOUT_ENGINE
from rlzoo.engines.vllm.options import Params
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import ModelShape, RolloutMemory, kv_cache_bytes, policy_bytes
from rlzoo.util.units import format_bytes

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig

# head sizes vLLM's attention kernels accept (its CPU and GPU backends); a policy sampled by vLLM needs one
VLLM_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 192, 256)


def model_problems(params: Params, run: RunFacts, at: str, engine: str) -> list[Problem]:
    """vLLM's head sizes; a context that fits the model; a KV cache (or a ``gpu_memory_utilization`` share of the
    GPU) that holds one whole sequence. ``engine``: the engine's name, as the config names it."""
    model, problems = run.model, []
    if model.head_dim is not None and model.head_dim not in VLLM_HEAD_DIMS:
        fix = (
            "use one of them"
            if model.tiny
            else f"use rollout.engine: {{name: {DEFAULT_ROLLOUT_ENGINE}}} or another model"
        )
        problems.append(
            (
                model.field("head_dim"),
                f"the model's head_dim {model.head_dim} is not supported by vLLM ({at} {engine}); vLLM supports "
                f"{list(VLLM_HEAD_DIMS)}: {fix}",
            )
        )
    limit, positions = params.max_model_len, model.max_positions
    if limit is not None and positions is not None and limit > positions:
        problems.append(
            (
                f"{at}.max_model_len",
                f"{limit} exceeds the model's max_position_embeddings {positions}; use at most {positions} or null",
            )
        )
    context = limit if limit is not None else positions  # the response's room in it: the core's rule
    if model.shape is not None and context is not None:
        problems += cache_problems(params, run, at, model.shape, context)
    return problems


def cache_problems(params: Params, run: RunFacts, at: str, shape: ModelShape, context: int) -> list[Problem]:
    """vLLM refuses to start when its KV cache cannot hold one sequence of the whole context."""
    needed = kv_cache_bytes(run.config, shape, context) // params.tensor_parallel_size
    fraction = params.gpu_memory_utilization
    if fraction is None:
        if params.kv_cache_memory_bytes >= needed:
            return []
        return [
            (
                f"{at}.kv_cache_memory_bytes",
                f"{params.kv_cache_memory_bytes} bytes cannot hold one sequence of the {context}-token context "
                f"({needed} bytes of keys and values in {run.config.model.dtype}); use at least {needed}, or lower "
                f"{at}.max_model_len",
            )
        ]
    if run.device_memory is None or run.memory is None:
        return []
    budget, weights = fraction * run.device_memory, run.memory.rollout_weights
    if budget > weights + needed:
        return []
    return [
        (
            f"{at}.gpu_memory_utilization",
            (
                f"{fraction:g} x {format_bytes(run.device_memory)} = {format_bytes(budget)} cannot hold vLLM's "
                f"{run.config.model.dtype} weights ({format_bytes(weights)}) and a KV cache: raise it above "
                f"{(weights + needed) / run.device_memory:.2f}, or use GPUs with more memory"
            ),
        )
    ]


def rollout_memory(params: Params, config: RunConfig, shape: ModelShape) -> RolloutMemory:
    """``gpu_memory_utilization`` x the device, if set; else ``kv_cache_memory_bytes`` + its weights (split by
    ``tensor_parallel_size``)."""
    weights = policy_bytes(config, shape) // params.tensor_parallel_size
    if params.gpu_memory_utilization is not None:
        return RolloutMemory(bytes=0, weights=weights, device_fraction=params.gpu_memory_utilization)
    return RolloutMemory(bytes=params.kv_cache_memory_bytes + weights, weights=weights)


def memory_hint(params: Params) -> str:
    """The option to change when the rollout's memory does not fit."""
    if params.gpu_memory_utilization is not None:
        return f"lower rollout.engine.gpu_memory_utilization (now {params.gpu_memory_utilization})"
    return f"lower rollout.engine.kv_cache_memory_bytes (now {params.kv_cache_memory_bytes})"
