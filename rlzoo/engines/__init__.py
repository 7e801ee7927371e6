"""Rollout and training engines: the interfaces, and the built-in engines by name.

``from rlzoo.engines import TorchTrainingEngine, DeepSpeedTrainingEngine, HFRolloutEngine, VLLMRolloutEngine``
imports a built-in engine to subclass (docs/writing-a-plugin.md). Their modules load on first use, so importing
this package stays cheap and never imports DeepSpeed or vLLM (neither engine module does before ``start``).
"""

from __future__ import annotations

from typing import Any

from rlzoo.engines.base import (
    Adapter,
    EngineContext,
    Generation,
    InFlightUpdates,
    LossFn,
    RolloutEngine,
    RoutingPass,
    SamplingSettings,
    TokenBatch,
    TrainingEngine,
)
from rlzoo.engines.gradients import GradientRequest
from rlzoo.engines.module_engine import ModuleTrainingEngine

#: the built-in engines: name -> the module that defines it (loaded on first use)
_ENGINES = {
    "HFRolloutEngine": "rlzoo.engines.hf_rollout",
    "VLLMRolloutEngine": "rlzoo.engines.vllm.rollout",
    "TorchTrainingEngine": "rlzoo.engines.torch_trainer",
    "DeepSpeedTrainingEngine": "rlzoo.engines.deepspeed.trainer",
}


def __getattr__(name: str) -> Any:
    if name in _ENGINES:
        import importlib

        return getattr(importlib.import_module(_ENGINES[name]), name)
    raise AttributeError(f"module 'rlzoo.engines' has no attribute {name!r}")


__all__ = [
    "Adapter",
    "DeepSpeedTrainingEngine",
    "EngineContext",
    "Generation",
    "GradientRequest",
    "HFRolloutEngine",
    "InFlightUpdates",
    "LossFn",
    "ModuleTrainingEngine",
    "RolloutEngine",
    "RoutingPass",
    "SamplingSettings",
    "TokenBatch",
    "TorchTrainingEngine",
    "TrainingEngine",
    "VLLMRolloutEngine",
]
