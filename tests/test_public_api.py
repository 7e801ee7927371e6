"""The public API: what users and plugin authors import, listed once. A refactor that moves code keeps these working.

docs/writing-a-plugin.md ("Rules") names the public modules; a name leaves this list only with a deprecation.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

PUBLIC: dict[str, tuple[str, ...]] = {
    "rlzoo": (
        "__version__",
        "hookimpl",
        "build_objective",
        "Objective",
        "load_config",
        "RunConfig",
        "default_registry",
        "Registry",
        "register",
    ),
    "rlzoo.hookspecs": (
        "hookimpl",
        "hookspec",
        "HOOK_KINDS",
        "rlzoo_ratio_estimators",
        "rlzoo_advantage_sources",
        "rlzoo_clippers",
        "rlzoo_aggregations",
        "rlzoo_kl_estimators",
        "rlzoo_kl_controllers",
        "rlzoo_value_losses",
        "rlzoo_corrections",
        "rlzoo_batch_filters",
        "rlzoo_reward_shapers",
        "rlzoo_regularisers",
        "rlzoo_router_policies",
        "rlzoo_verifiers",
        "rlzoo_tasks",
        "rlzoo_tools",
        "rlzoo_tool_parsers",
        "rlzoo_environments",
        "rlzoo_rollout_engines",
        "rlzoo_training_engines",
        "rlzoo_loggers",
        "rlzoo_component_modules",
    ),
    "rlzoo.interfaces": (
        "AdvantageSource",
        "BatchFilter",
        "ClipResult",
        "Clipper",
        "Component",
        "Environment",
        "KLController",
        "KLEstimator",
        "Logger",
        "LossAggregation",
        "MalformedCall",
        "Max",
        "Mean",
        "Min",
        "MismatchCorrection",
        "ModelFacts",
        "Observation",
        "Params",
        "ParsedTurn",
        "PolicyBatch",
        "Problem",
        "RatioEstimator",
        "RecordedRouting",
        "Regulariser",
        "ResponseTooLong",
        "RewardBatch",
        "RewardShaper",
        "RouterPolicy",
        "RunFacts",
        "Sample",
        "Sum",
        "Task",
        "Tool",
        "ToolCall",
        "ToolCallParser",
        "ToolError",
        "ToolTimeout",
        "TrackedRun",
        "ValueLoss",
        "ValueLossResult",
        "Verdict",
        "Verifier",
        "TokenStatistic",
        "register_token_statistic",
    ),
    "rlzoo.errors": (
        "RlzooError",
        "ConfigError",
        "RegistryError",
        "UnknownComponentError",
        "DuplicateComponentError",
        "DataError",
    ),
    "rlzoo.metrics": ("Declared", "Mean", "Sum", "Min", "Max", "SkippedUpdates", "UnscoredResponses", "declared"),
    "rlzoo.tools": ("run_tool_calls", "ToolOutcome"),
    "rlzoo.registry": ("Registry", "default_registry", "register"),
    "rlzoo.engines": (
        "Adapter",
        "EngineContext",
        "Generation",
        "GradientRequest",  # TrainingEngine.gradients' argument (rlzoo mismatch's per-correction gradients)
        "InFlightUpdates",
        "LossFn",
        "ModuleTrainingEngine",
        "RolloutEngine",
        "RoutingPass",
        "SamplingSettings",
        "TokenBatch",
        "TrainingEngine",
        "TorchTrainingEngine",
        "DeepSpeedTrainingEngine",
        "HFRolloutEngine",
        "VLLMRolloutEngine",
    ),
    "rlzoo.engines.hf_rollout": ("HFRolloutEngine",),
    "rlzoo.engines.torch_trainer": ("TorchTrainingEngine",),
    "rlzoo.engines.deepspeed.trainer": ("DeepSpeedTrainingEngine",),
    "rlzoo.engines.vllm.rollout": ("VLLMRolloutEngine",),
    "rlzoo.moe": ("Routing", "find_routers", "record_routing", "replay_routing", "routing_for_batch", "flip_rate"),
    "rlzoo.services": (
        "ResponseCache",
        "ServiceClient",
        "ServiceError",
        "ServiceParams",
        "ServiceStats",
        "ServiceVerifier",
        "cache_key",
        "endpoint_problem",
        "percentile",
        "retry_after_s",
    ),
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


def test_engines_export_exactly_the_listed_names():
    import rlzoo.engines

    assert sorted(rlzoo.engines.__all__) == sorted(PUBLIC["rlzoo.engines"])


def test_the_built_in_engines_import_from_rlzoo_engines_and_are_the_registered_ones():
    import rlzoo.engines
    from rlzoo.registry import default_registry

    registry = default_registry()
    for kind, name, cls in [
        ("training_engine", "torch", "TorchTrainingEngine"),
        ("training_engine", "deepspeed", "DeepSpeedTrainingEngine"),
        ("rollout_engine", "hf", "HFRolloutEngine"),
        ("rollout_engine", "vllm", "VLLMRolloutEngine"),
    ]:
        assert registry.get(kind, name).cls is getattr(rlzoo.engines, cls)


def test_importing_the_engines_loads_neither_deepspeed_nor_vllm():
    """``rlzoo.engines`` is imported by every run and plugin discovery: its built-in engines load on first use, and
    even then DeepSpeed and vLLM only when an engine starts."""
    code = (
        "import sys, rlzoo.engines\n"
        "assert not [m for m in sys.modules if m.startswith(('rlzoo.engines.deepspeed', 'rlzoo.engines.vllm'))]\n"
        "from rlzoo.engines import DeepSpeedTrainingEngine, HFRolloutEngine, TorchTrainingEngine, VLLMRolloutEngine\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'deepspeed', 'vllm'}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_entry_points_load():
    """The core registers its own engines and environments through the ``rlzoo`` group, as any plugin does."""
    points = {ep.name: ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.dist.name == "rlzoo"}
    assert sorted(points) == ["engines", "environments"]
    for point in points.values():
        point.load()
    [script] = [ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == "rlzoo"]
    assert script.value == "rlzoo.cli:main"
