"""The server side of rlzoo's ``gloo`` weight-transfer backend: a vLLM plugin, loaded inside each vLLM server.

vLLM's built-in backends (``nccl``, ``ipc``, ...) need CUDA; this one runs anywhere torch's gloo does, which makes
CPU servers (and the tests) able to take new weights through vLLM's own RL API (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``). :func:`register` is the entry point of
the ``vllm.general_plugins`` group (``pyproject.toml``), which vLLM calls in every process it starts, the worker
included; it registers :class:`GlooWeightTransferEngine` under :data:`BACKEND` with
``WeightTransferEngineFactory.register_engine``. A server selects it with
``--weight-transfer-config '{"backend": "rlzoo-gloo"}'``.

One update: ``start_weight_update`` opens vLLM's layerwise reload (weights land on the meta device and are
materialised layer by layer), ``update_weights`` receives each named tensor by a broadcast from the trainer (rank 0
of one gloo group with every server's workers, :mod:`rlzoo.engines.vllm_server.gloo_group`) and hands it to
``model.load_weights``, ``finish_weight_update`` finalises the reload and, on CPU, re-packs the fused-MoE experts as
the in-process engine does (:func:`rlzoo.engines.vllm.worker.repack_cpu_moe`). ``update_weights`` is overridden
because the base class's calls ``torch.accelerator.synchronize()``, which has no accelerator to synchronise on CPU.

Reference: ``vllm/distributed/weight_transfer/nccl_engine.py`` (the same lifecycle over NCCL).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.engines.vllm.lora import CPU_MOE_LORA_ENV, keep_cpu_moe_kernel
from rlzoo.engines.vllm.worker import repack_cpu_moe
from rlzoo.engines.vllm_server.gloo_group import BACKEND, broadcast, join


def register() -> None:
    """The ``vllm.general_plugins`` entry point: make :data:`BACKEND` known to vLLM's factory (once per process); in
    a server rlzoo serves LoRA adapters from (:data:`CPU_MOE_LORA_ENV` set), also keep the CPU fused-MoE kernel under
    LoRA, since this is the one hook rlzoo has into the processes where vLLM builds the model."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GlooWeightTransferEngine")
    if os.environ.get(CPU_MOE_LORA_ENV) == "1":
        keep_cpu_moe_kernel()


@dataclass
class GlooInitInfo:
    """Where the trainer hosts the group's store; this server's workers join as ranks ``rank_offset`` onwards (one per
    worker, numbered as vLLM's NCCL backend numbers them) of ``world_size`` (the trainer and every server's workers)."""

    master_address: str
    master_port: int
    rank_offset: int = 1
    world_size: int = 2
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo:
    """The tensors of one update, in the order the trainer broadcasts them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


def _engine_base() -> type:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    return WeightTransferEngine


class GlooWeightTransferEngine(_engine_base()):  # type: ignore[misc]  # vLLM's base, imported only in the server
    """Receives checkpoint-format weights over gloo and loads them with vLLM's layerwise reload."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.group = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group (again, when the trainer re-creates it: the old group is dropped)."""
        parallel = self.vllm_config.parallel_config
        worker = parallel.data_parallel_index * parallel.world_size + parallel.rank  # worker_init_process_group's
        self.group = None
        self.group = join(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        repack_cpu_moe(self.model, self.device)  # vLLM's CPU MoE kernel reads prepacked experts (the vllm engine's fix)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # no accelerator to synchronise (the base's)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("rlzoo-gloo weight transfer: /update_weights before /init_weight_transfer_engine")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            broadcast(self.group, weight)
            self.model.load_weights([(name, weight)])

    def shutdown(self) -> None:
        self.group = None
