"""A LoRA policy's base model as the KL reference: the training engine's own forwards with its adapters disabled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rlzoo.engines.base import TokenBatch


class BasePolicy:
    """A LoRA policy's base model, for the KL reference: the training engine's own forwards with the adapters
    disabled, so the reference costs no second copy of the weights (:meth:`ModuleTrainingEngine.without_adapters`).
    It answers the passes a reference :class:`~rlzoo.rl.learner.Learner` asks for; it never trains."""

    def __init__(self, engine: Any) -> None:  # a ModuleTrainingEngine (whose module imports this one)
        self.engine = engine
        self.name = f"{engine.name} (adapters disabled)"

    @contextmanager
    def _disabled(self) -> Iterator[None]:
        with self.engine.model.disable_adapter():
            yield

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        with self._disabled():
            return self.engine.logprobs(batch)

    def logprobs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with self._disabled():
            return self.engine.logprobs_and_entropy(batch)
