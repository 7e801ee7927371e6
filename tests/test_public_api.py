"""The public API: what users and plugin authors import, listed once. A refactor that moves code keeps these working.

docs/writing-a-plugin.md ("Rules") names the public modules; a name leaves this list only with a deprecation.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

PUBLIC: dict[str, tuple[str, ...]] = {
    "rlzoo": ("__version__", "hookimpl", "build_objective", "Objective", "load_config", "RunConfig",
              "default_registry", "Registry", "register"),
    "rlzoo.hookspecs": ("hookimpl", "hookspec", "HOOK_KINDS", "rlzoo_ratio_estimators", "rlzoo_advantage_sources",
                        "rlzoo_clippers", "rlzoo_aggregations", "rlzoo_kl_estimators", "rlzoo_kl_controllers",
                        "rlzoo_value_losses", "rlzoo_corrections", "rlzoo_batch_filters", "rlzoo_reward_shapers",
                        "rlzoo_regularisers", "rlzoo_router_policies", "rlzoo_verifiers", "rlzoo_tasks", "rlzoo_tools",
                        "rlzoo_tool_parsers", "rlzoo_environments", "rlzoo_rollout_engines",
                        "rlzoo_training_engines", "rlzoo_loggers"),
    "rlzoo.interfaces": ("AdvantageSource", "BatchFilter", "ClipResult", "Clipper", "Component", "Environment",
                         "KLController", "KLEstimator", "Logger", "LossAggregation", "MalformedCall", "Max", "Mean",
                         "Min", "MismatchCorrection", "ModelFacts", "Observation", "Params", "ParsedTurn",
                         "PolicyBatch", "Problem", "RatioEstimator", "RecordedRouting", "Regulariser", "ResponseTooLong",
                         "RewardBatch", "RewardShaper", "RouterPolicy", "RunFacts", "Sample", "Sum", "Task", "Tool",
                         "ToolCall", "ToolCallParser", "ToolError", "ToolTimeout", "TrackedRun", "ValueLoss",
                         "ValueLossResult", "Verdict", "Verifier"),
    "rlzoo.errors": ("RlzooError", "ConfigError", "RegistryError", "UnknownComponentError", "DuplicateComponentError",
                     "DataError"),
    "rlzoo.metrics": ("Declared", "Mean", "Sum", "Min", "Max", "SkippedUpdates", "UnscoredResponses", "declared"),
    "rlzoo.tools": ("run_tool_calls", "ToolOutcome"),
    "rlzoo.registry": ("Registry", "default_registry", "register"),
    "rlzoo.engines": ("Adapter", "EngineContext", "Generation", "LossFn", "ModuleTrainingEngine", "RolloutEngine",
                      "RoutingPass", "SamplingSettings", "TokenBatch", "TrainingEngine"),
    "rlzoo.engines.hf_rollout": ("HFRolloutEngine",),
    "rlzoo.engines.torch_trainer": ("TorchTrainingEngine",),
    "rlzoo.engines.deepspeed.trainer": ("DeepSpeedTrainingEngine",),
    "rlzoo.engines.vllm.rollout": ("VLLMRolloutEngine",),
    "rlzoo.moe": ("Routing", "find_routers", "record_routing", "replay_routing", "routing_for_batch", "flip_rate"),
    "rlzoo.cli": ("main",),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_import(module):
    loaded = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(loaded, name)]
    assert missing == [], f"{module} lacks {missing}"


def test_interfaces_export_exactly_the_listed_names():
    import rlzoo.interfaces

    assert sorted(rlzoo.interfaces.__all__) == sorted(PUBLIC["rlzoo.interfaces"])


def test_entry_points_load():
    """The core registers its own engines and environments through the ``rlzoo`` group, as any plugin does."""
    points = {ep.name: ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.dist.name == "rlzoo"}
    assert sorted(points) == ["engines", "environments"]
    for point in points.values():
        point.load()
    [script] = [ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == "rlzoo"]
    assert script.value == "rlzoo.cli:main"
