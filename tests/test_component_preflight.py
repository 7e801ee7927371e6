"""The self-check contract (``Component.preflight``) and engines that own their rules and their module.

- every component the config names is asked, with the run's facts (model, processes, the other components, the
  memory estimate), and its problems are reported by field;
- the memory estimate asks the engines for their parts (a plugin engine's layout changes it);
- no core module outside ``rlzoo/engines/`` names an engine or reads an engine's parameters, and none touches a
  training engine's ``model``.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
from pydantic import Field

import rlzoo
from rlzoo.config.resolution import build_config
from rlzoo.engines import TrainingEngine
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.errors import ConfigError
from rlzoo.interfaces import BatchFilter, Params, RunFacts
from rlzoo.models.memory import ModelShape, TrainingLayout
from rlzoo.preflight.checks import preflight
from rlzoo.preflight.memory_fit import estimate
from rlzoo.registry import Registry, default_registry

ROOT = Path(__file__).resolve().parent.parent
SEEN: list[RunFacts] = []


class QuotaFilter(BatchFilter):
    """Keeps every group; needs ``quota`` groups per step at most (a test's rule of its own)."""

    name = "quota-filter"

    class Params(Params):
        quota: int = Field(4, ge=1)

    def preflight(self, run: RunFacts, at: str) -> list[tuple[str, str]]:
        SEEN.append(run)
        prompts = run.config.rollout.prompts_per_step
        if prompts > self.params.quota:
            return [
                (f"{at}.quota", f"{self.params.quota} is below rollout.prompts_per_step {prompts}; use >= {prompts}")
            ]
        return []


class PartitionedTrainer(TorchTrainingEngine):
    """A plugin training engine that declares it partitions everything (ZeRO-3-like) over the ranks."""

    name = "partitioned"
    data_parallel = True

    def memory_layout(self) -> TrainingLayout:
        return TrainingLayout(zero_stage=3)


def registry_with_plugins():
    registry = Registry.discover()  # its own: default_registry() is shared by every test of the session
    module = types.ModuleType("preflight_test_plugins")
    module.rlzoo_batch_filters = rlzoo.hookimpl(lambda: [QuotaFilter])
    module.rlzoo_batch_filters.__name__ = "rlzoo_batch_filters"
    module.rlzoo_training_engines = rlzoo.hookimpl(lambda: [PartitionedTrainer])
    module.rlzoo_training_engines.__name__ = "rlzoo_training_engines"
    registry.add_plugin(module, name="preflight-test", distribution="preflight-test-dist")
    return registry


def test_a_components_rule_is_reported_by_field_with_the_runs_facts(tmp_path):
    registry = registry_with_plugins()
    data = {
        "output_dir": str(tmp_path / "run"),
        "rollout": {"prompts_per_step": 8},
        "algorithm": {"preset": "grpo", "batch_filter": {"name": "quota-filter", "quota": 2}},
    }
    SEEN.clear()
    with pytest.raises(ConfigError) as err:
        preflight(build_config(data, registry=registry), registry, world=1)
    assert err.value.problems == [("algorithm.batch_filter.quota", "2 is below rollout.prompts_per_step 8; use >= 8")]
    run = SEEN[-1]
    assert run.world == 1 and run.model.moe is True and run.model.tiny  # the default tiny Qwen3-MoE
    assert run.rollout_engine.name == "hf" and run.training_engine.name == "torch"
    assert run.components["algorithm.batch_filter"].params.quota == 2
    assert run.memory is not None and run.memory.parts["weights"] > 0
    data["algorithm"]["batch_filter"]["quota"] = 8
    preflight(build_config(data, registry=registry), registry)  # the rule holds: no problem


def test_the_memory_estimate_asks_the_training_engine_for_its_layout():
    registry = registry_with_plugins()
    config = build_config({"trainer": {"engine": {"name": "partitioned"}}}, registry=registry)
    shape = ModelShape.from_tiny(config.model.tiny)
    whole = estimate(config, shape, world=4, training=registry.create("training_engine", "torch", {}))
    split = estimate(config, shape, world=4, training=registry.create("training_engine", "partitioned", {}))
    assert split.parts["weights"] < whole.parts["weights"] and split.parts["optimizer"] < whole.parts["optimizer"]
    assert split.parts["gathered"] > 0 and whole.parts["gathered"] == 0  # ZeRO-3 gathers layers to compute


def test_a_kv_cache_too_small_for_one_sequence_is_the_vllm_engines_problem(tmp_path):
    registry = default_registry()
    config = build_config(
        {"output_dir": str(tmp_path / "run"), "rollout": {"engine": {"name": "vllm", "kv_cache_memory_bytes": 10}}},
        registry=registry,
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    ((field, message),) = err.value.problems
    assert field == "rollout.engine.kv_cache_memory_bytes" and "use at least" in message


def _core_modules() -> list[Path]:
    """The core outside rlzoo/engines/ (rlzoo/models/ holds the engines' model code: DeepSpeed-MoE blocks)."""
    skip = {ROOT / "rlzoo" / "engines", ROOT / "rlzoo" / "models"}
    return [p for p in (ROOT / "rlzoo").rglob("*.py") if not any(s in p.parents for s in skip)]


def _engine_references(tree: ast.AST, engines: set[str]) -> list[tuple[int, str]]:
    """An engine's name compared or looked up (``spec.name == "vllm"``, ``registry.create(..., "hf")``), and a
    component's parameter read by key (``params.get("zero_stage")``, ``params["batch_size"]``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in engines:
                    found.append((node.lineno, f"compares with engine {side.value!r}"))
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in engines and "create" in ast.unparse(node.func):
                    found.append((node.lineno, f"creates engine {arg.value!r}"))
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and "params" in ast.unparse(node.func.value)
            ):
                found.append((node.lineno, f"reads {ast.unparse(node)}"))
        elif isinstance(node, ast.Subscript) and "params" in ast.unparse(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append((node.lineno, f"reads {ast.unparse(node)}"))
    return found


def test_the_core_names_no_engine_and_reads_no_engine_parameter():
    registry = default_registry()
    engines = set(registry.names("rollout_engine")) | set(registry.names("training_engine"))
    found = [
        f"{path.relative_to(ROOT)}:{line} {what}"
        for path in _core_modules()
        for line, what in _engine_references(ast.parse(path.read_text()), engines)
    ]
    assert not found, "\n".join(found)
    # the check sees what it must: the code this test replaced would have been caught
    old = 'if spec.name == "vllm" and spec.params.get("gpu_memory_utilization") is not None: pass'
    assert len(_engine_references(ast.parse(old), engines)) == 2


def test_nothing_outside_the_engines_touches_a_training_engines_model():
    found = []
    for path in _core_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "model":
                owner = ast.unparse(node.value)
                if any(word in owner.lower() for word in ("engine", "trainer", "learner")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {owner}.model")
    assert not found, "\n".join(found)
    assert "model" not in TrainingEngine.__dict__  # the base class asks for methods, not a module
