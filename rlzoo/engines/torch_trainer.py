"""Training with plain torch: one process, AdamW, gradient clipping, fp32 or bf16 autocast.

For MoE models the router load-balancing term is added as in every engine (:mod:`rlzoo.engines.aux_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from rlzoo.checkpoint import load_optimizer, save_optimizer
from rlzoo.engines.aux_loss import AuxLoss, AuxLossParams
from rlzoo.engines.base import EngineContext, LossFn, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import response_logprobs, response_logprobs_and_entropy


class TorchTrainingEngine(TrainingEngine):
    """Plain torch AdamW on one device; the reference for what the distributed engines must reproduce."""

    name = "torch"

    class Params(AuxLossParams):
        """The parameters every training engine shares; none of its own."""

    def start(self, context: EngineContext, trainer_config: Any) -> None:
        from rlzoo.models import load_model

        self.context = context
        self.config = trainer_config
        self._model, _ = load_model(context.model_dir, "float32")  # fp32 master weights
        self._model.train()
        self.optimizer = torch.optim.AdamW(
            self._model.parameters(),
            lr=trainer_config.lr,
            betas=tuple(trainer_config.betas),
            weight_decay=trainer_config.weight_decay,
        )
        self._aux_loss = AuxLoss(self._model, self.params.aux_loss_coef)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def _autocast(self):
        if self.config.dtype == "bfloat16":
            return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
        return nullcontext()

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        with self._autocast():
            return response_logprobs(self._model, batch).float().cpu()

    @torch.no_grad()
    def logprobs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            logp, entropy = response_logprobs_and_entropy(self._model, batch)
        return logp.float().cpu(), entropy.float().cpu()

    def train_step(self, batch: TokenBatch, loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast(), self._aux_loss.forward():
            logp, entropy = response_logprobs_and_entropy(self._model, batch, entropy=with_entropy)
        outputs = loss_fn(logp.float(), entropy.float()) if with_entropy else loss_fn(logp.float())
        loss, metrics = self._aux_loss.add(*outputs, batch.attention_mask)
        if not torch.isfinite(loss):
            return {**metrics, "train/nonfinite_steps": 1.0}
        loss.backward()
        clip = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self._model.parameters(), clip)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return {**metrics, "train/nonfinite_steps": 1.0, "train/grad_norm": float("nan")}
        self.optimizer.step()
        return {**metrics, "train/nonfinite_steps": 0.0, "train/grad_norm": grad_norm.item()}

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        from rlzoo.models.export import checkpoint_weights

        return checkpoint_weights(self._model)

    def save(self, directory: Path) -> None:
        self._model.save_pretrained(directory / "model", safe_serialization=True)
        save_optimizer(self.optimizer, directory)

    def load_state(self, directory: Path) -> None:
        from safetensors.torch import load_file

        from rlzoo.models.weights import load_checkpoint_weights

        load_checkpoint_weights(self._model, load_file(str(directory / "model" / "model.safetensors")).items())
        load_optimizer(self.optimizer, directory)
