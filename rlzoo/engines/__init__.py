"""Rollout and training engines."""

from rlzoo.engines.base import (
    EngineContext,
    Generation,
    LossFn,
    RolloutEngine,
    SamplingSettings,
    TokenBatch,
    TrainingEngine,
)

__all__ = [
    "EngineContext",
    "Generation",
    "LossFn",
    "RolloutEngine",
    "SamplingSettings",
    "TokenBatch",
    "TrainingEngine",
]
