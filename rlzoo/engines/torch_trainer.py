"""Training with plain torch: one process, AdamW, gradient clipping, fp32 or bf16 autocast.

For MoE models the router load-balancing term is added as in every engine (:mod:`rlzoo.engines.aux_loss`); passes
run in micro-batches under ``trainer.max_tokens_per_micro_batch`` (:mod:`rlzoo.engines.module_engine`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rlzoo.engines.aux_loss import AuxLoss, AuxLossParams
from rlzoo.engines.base import EngineContext
from rlzoo.engines.module_engine import NONFINITE, ModuleTrainingEngine
from rlzoo.engines.optimizer import adamw
from rlzoo.runtime.checkpoint.files import load_optimizer, save_optimizer


class TorchTrainingEngine(ModuleTrainingEngine):
    """Plain torch AdamW on one device (``context.device``, the config's ``device``); the reference for what the
    distributed engines must reproduce."""

    name = "torch"

    class Params(AuxLossParams):
        """The parameters every training engine shares; none of its own."""

    def start(self, context: EngineContext, trainer_config: Any) -> None:
        self.context = context
        self.config = trainer_config
        self._model = self._load_module().to(context.device)  # fp32 master weights
        self._model.train()
        self._prepare_model(self._model)
        self.optimizer = adamw(self._trained(), trainer_config)
        self._aux_loss = AuxLoss(self._model, self.params.aux_loss_coef)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def _module(self) -> torch.nn.Module:
        return self._model

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def _optimizer_step(self) -> dict[str, float]:
        clip = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        # read once: whether to step is the one thing a minibatch waits on the device for here
        grad_norm = torch.nn.utils.clip_grad_norm_(self._model.parameters(), clip).item()
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return {NONFINITE: 1.0, "train/grad_norm": float("nan")}
        self.optimizer.step()
        return {NONFINITE: 0.0, "train/grad_norm": grad_norm}

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        from rlzoo.engines.lora import merged_weights
        from rlzoo.models.export import checkpoint_weights

        return merged_weights(self._model) if self.lora else checkpoint_weights(self._model)

    def save(self, directory: Path) -> None:
        self._model.save_pretrained(directory / "model", safe_serialization=True)  # a peft model: its adapters
        save_optimizer(self.optimizer, directory)

    def load_state(self, directory: Path) -> None:
        from rlzoo.engines.lora import load_adapter

        if self.lora:
            load_adapter(self._model, directory / "model")
        else:
            from safetensors.torch import load_file

            from rlzoo.models.weights import load_checkpoint_weights

            load_checkpoint_weights(self._model, load_file(str(directory / "model" / "model.safetensors")).items())
        load_optimizer(self.optimizer, directory)
