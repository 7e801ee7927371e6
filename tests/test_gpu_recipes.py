"""Every GPU recipe in examples/gpu passes `rlzoo config check` on CPU, from its model's config.json facts.

Each recipe lists the checks it must pass in `# check: ARGS` lines (the arguments of `rlzoo config check` after
the file). The data files and the model folder are not on this machine: the data paths are pointed at a small verl
parquet written here; the model is checked from `--model-config` (shapes only, no weights).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from rlzoo.config.resolution import load_config
from rlzoo.errors import ConfigError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "examples" / "gpu").glob("*.yaml"))

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("vllm", "deepspeed", "datasets")),
    reason="the recipes use vLLM, DeepSpeed and the dataset task",
)


def checks(recipe: Path) -> list[argparse.Namespace]:
    """The recipe's ``# check:`` lines, read as scripts/gpu_memory_table.py reads them."""
    import runpy

    return runpy.run_path(str(REPO / "scripts" / "gpu_memory_table.py"))["checks"](recipe)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    import datasets

    folder = tmp_path_factory.mktemp("math")
    for split, start in (("train", 0), ("test", 100)):
        rows = [
            {
                "data_source": "math",
                "prompt": [{"role": "user", "content": f"{i}+1? Answer in \\boxed{{}}."}],
                "reward_model": {"ground_truth": str(i + 1)},
            }
            for i in range(start, start + 8)
        ]
        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
    return folder


def test_there_are_recipes():
    names = {p.name for p in RECIPES}
    assert {
        "qwen3_30b_a3b_gspo.yaml",
        "qwen3_30b_a3b_gspo_routing_replay.yaml",
        "qwen3_30b_a3b_gspo_servers.yaml",
        "qwen3_moe_small_gspo.yaml",
        "qwen3_moe_small_grpo.yaml",
        "qwen3_1.7b_grpo.yaml",
    } <= names
    assert all(checks(p) for p in RECIPES), "every recipe names its checks"


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_passes_config_check(recipe, data, tmp_path):
    registry = default_registry()
    for args in checks(recipe):
        overrides = [
            *args.set,
            f"task.path={data / 'train.parquet'}",
            f"task.eval_path={data / 'test.parquet'}",
            f"output_dir={tmp_path / 'run'}",
        ]
        config = load_config(recipe, overrides, registry)
        preflight(config, registry, world=args.processes, model_config=REPO / args.model_config)
        assert config.cold_start.enabled is False and config.model.path
        assert config.model.dtype == "bfloat16" and config.trainer.dtype == "bfloat16"


def test_gspo_recipes_have_the_papers_settings():
    registry = default_registry()
    for name in (
        "qwen3_30b_a3b_gspo",
        "qwen3_30b_a3b_gspo_routing_replay",
        "qwen3_30b_a3b_gspo_servers",
        "qwen3_moe_small_gspo",
    ):
        algo = load_config(REPO / "examples" / "gpu" / f"{name}.yaml", registry=registry).algorithm
        assert algo.ratio.name == "sequence" and algo.kl_coef == 0.0 and algo.minibatches_per_rollout == 4
        assert (algo.clipper.params["eps_low"], algo.clipper.params["eps_high"]) == (3e-4, 4e-4)
        assert (algo.router is not None) == name.endswith("routing_replay")


def test_model_config_stands_in_for_the_folder_and_is_checked(data, tmp_path):
    """A recipe's shapes are really checked: a config.json with a head size vLLM lacks is refused."""
    registry = default_registry()
    recipe = REPO / "examples" / "gpu" / "qwen3_moe_small_gspo.yaml"
    overrides = [
        f"task.path={data / 'train.parquet'}",
        f"task.eval_path={data / 'test.parquet'}",
        f"output_dir={tmp_path / 'run'}",
    ]
    config = load_config(recipe, overrides, registry)
    with pytest.raises(ConfigError, match="model.path: models/qwen3-moe-small does not exist"):
        preflight(config, registry)
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "qwen3_moe", "num_experts": 8, "head_dim": 48, "max_position_embeddings": 2048}')
    with pytest.raises(ConfigError) as err:
        preflight(config, registry, model_config=bad)
    assert "head_dim 48 is not supported by vLLM" in str(err.value)
    assert "rollout.engine.max_model_len: 3072 exceeds the model's max_position_embeddings 2048" in str(err.value)
    bad.write_text('{"model_type": "qwen3_moe", "num_experts": 8, "head_dim": 128, "max_position_embeddings": 2048}')
    config = load_config(recipe, [*overrides, "rollout.engine.max_model_len=null"], registry)
    with pytest.raises(ConfigError) as err:
        preflight(config, registry, model_config=bad)
    assert "prompt.max_prompt_tokens: 1024 + rollout.max_new_tokens 2048 exceeds the 2048-token context" in str(
        err.value
    )


def test_cli_config_check_takes_model_config(data, tmp_path, capsys):
    from rlzoo.cli import main

    recipe = "examples/gpu/qwen3_30b_a3b_gspo.yaml"
    common = [
        str(REPO / recipe),
        "--processes",
        "16",
        "--set",
        f"task.path={data / 'train.parquet'}",
        "--set",
        f"task.eval_path={data / 'test.parquet'}",
        "--set",
        f"output_dir={tmp_path / 'run'}",
    ]
    model_config = str(REPO / "examples/gpu/models/qwen3-30b-a3b/config.json")
    assert main(["config", "check", *common, "--model-config", model_config]) == 0
    assert "Qwen3-30B-A3B" in capsys.readouterr().out
    assert main(["config", "check", *common]) == 1  # without it the missing model folder is an error
    assert "model.path: models/Qwen3-30B-A3B does not exist" in capsys.readouterr().err


def test_the_server_pool_recipe_takes_routing_replay_but_not_r3(data, tmp_path):
    """qwen3_30b_a3b_gspo_servers.yaml's header: replay-old (the trainer's own routing) runs with the server pool;
    R3 (the rollout's routing) is refused before the run, the servers recording none."""
    registry = default_registry()
    recipe = REPO / "examples" / "gpu" / "qwen3_30b_a3b_gspo_servers.yaml"
    assert "can_record_routing false" in recipe.read_text()
    overrides = [
        f"task.path={data / 'train.parquet'}",
        f"task.eval_path={data / 'test.parquet'}",
        f"output_dir={tmp_path / 'run'}",
    ]
    model_config = REPO / "examples/gpu/models/qwen3-30b-a3b/config.json"
    config = load_config(recipe, [*overrides, "algorithm.router={name: replay-rollout}"], registry)
    with pytest.raises(ConfigError, match="'vllm-server' does not record MoE routing"):
        preflight(config, registry, world=8, model_config=model_config)
