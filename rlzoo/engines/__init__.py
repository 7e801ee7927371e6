"""Rollout and training engines."""

from rlzoo.engines.base import (
    Adapter,
    EngineContext,
    Generation,
    LossFn,
    RolloutEngine,
    RoutingPass,
    SamplingSettings,
    TokenBatch,
    TrainingEngine,
)
from rlzoo.engines.module_engine import ModuleTrainingEngine

__all__ = [
    "Adapter",
    "EngineContext",
    "Generation",
    "LossFn",
    "ModuleTrainingEngine",
    "RolloutEngine",
    "RoutingPass",
    "SamplingSettings",
    "TokenBatch",
    "TrainingEngine",
]
