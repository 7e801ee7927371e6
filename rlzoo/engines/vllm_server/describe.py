"""What ``rlzoo config check`` prints about the vllm-server engine's pool, beside the trainer's memory estimate: where
the servers are and what each holds (the servers hold nothing on the trainer's devices).

Per device of a server it is the in-process engine's rule (:func:`rlzoo.engines.vllm.limits.rollout_memory`: the
weights split over ``tensor_parallel_size`` devices, plus the KV cache, or ``gpu_memory_utilization`` of the
device), for servers rlzoo starts (``launch``, ``ray``): their options carry the in-process engine's names. For
servers started elsewhere only the weights are known: their tensor parallelism is not in the config, so the weights
per device for the sizes one would choose (to pick one that fits). A module of its own so that the engine's module stays about
the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlzoo.engines.vllm import limits
from rlzoo.engines.vllm_server import options
from rlzoo.models.memory import ModelShape, policy_bytes
from rlzoo.util.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig


def pool_lines(p: options.Params, config: RunConfig, shape: ModelShape) -> tuple[str, ...]:
    """The pool's placement, then what one server holds (servers started elsewhere: and per device by TP size)."""
    weights = policy_bytes(config, shape)
    holds = f"  per server: weights {format_bytes(weights)} ({config.model.dtype})"
    if p.launch is not None:
        launch = p.launch
        count = len(launch.devices) if launch.devices else launch.count
        devices = " | ".join(launch.devices) if launch.devices else "not named (this machine's, inherited)"
        return (
            f"rollout pool (rollout.engine.launch), on devices of its own: {count} server(s), tensor_parallel_size "
            f"{launch.tensor_parallel_size}, devices {devices}",
            f"{holds}; per device of a server: {_budget(launch, config, shape)}",
        )
    if p.ray is not None:
        ray = p.ray
        gpus = "tensor_parallel_size when the cluster has GPUs" if ray.num_gpus is None else f"{ray.num_gpus}"
        return (
            f"rollout pool (rollout.engine.ray), on the Ray cluster at {ray.address}: {ray.count} server(s), "
            f"tensor_parallel_size {ray.tensor_parallel_size}, one placement-group bundle each (CPUs "
            f"{ray.num_cpus:g}, GPUs {gpus}; on one node), placement_strategy {ray.placement_strategy}",
            f"{holds}; per device of a server: {_budget(ray, config, shape)}",
        )
    servers = p.servers or []
    sizes = ", ".join(f"{tp}: {format_bytes(weights // tp)}" for tp in (1, 2, 4, 8))
    return (
        f"rollout pool (rollout.engine vllm-server), on devices of its own: {len(servers)} started elsewhere "
        f"({', '.join(servers)})",
        f"{holds[:-1]}, split over its tensor-parallel devices), the KV cache it was started with",
        f"  weights per device by the servers' --tensor-parallel-size {sizes}",
    )


def _budget(server: options.ServerParams, config: RunConfig, shape: ModelShape) -> str:
    per_device = limits.rollout_memory(server, config, shape)  # the in-process options' names
    if server.gpu_memory_utilization is not None:
        budget = f"{server.gpu_memory_utilization:g} x its memory (gpu_memory_utilization): weights "
        budget += format_bytes(per_device.weights)
        device = parse_bytes(config.trainer.device_memory) if config.trainer.device_memory else None
        if device:  # the pool's GPUs are not named in the config: say what a device like the trainer's leaves
            kv = int(server.gpu_memory_utilization * device) - per_device.weights
            budget += f", KV cache {format_bytes(kv)} on a {format_bytes(device)} device (trainer.device_memory)"
        return budget
    return (
        f"{format_bytes(per_device.bytes)}: weights {format_bytes(per_device.weights)} + KV cache "
        f"{format_bytes(server.kv_cache_memory_bytes)}"
    )
