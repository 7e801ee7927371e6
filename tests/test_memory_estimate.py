"""The GPU memory estimate (rlzoo.models.memory): its arithmetic, ZeRO partitioning, activation checkpointing, the
preflight refusing a config that cannot fit, and the GPU recipes fitting the device memory they name.

The expected numbers are written out here from the formula in the module's docstring, not computed by its
functions; the parameter count is also checked against transformers models built from the same config.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlzoo.config.resolution import build_config, load_config
from rlzoo.errors import ConfigError
from rlzoo.models.memory import ModelShape
from rlzoo.preflight.checks import preflight
from rlzoo.preflight.memory_fit import estimate
from rlzoo.registry import default_registry
from rlzoo.util.units import GB, GiB, parse_bytes

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "examples" / "gpu").glob("*.yaml"))

# a small Qwen3-MoE: 2 layers, both MoE
MOE = {
    "model_type": "qwen3_moe",
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 40,
    "moe_intermediate_size": 12,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}
DENSE = {
    "model_type": "qwen3",
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 40,
    "tie_word_embeddings": True,
}


def run_config(**trainer) -> object:
    """A config whose every estimate input is spelled out; ``trainer`` overrides the trainer section."""
    engine = trainer.pop("engine", {"name": "torch"})
    return build_config(
        {
            "algorithm": {"kl_coef": 0.0},
            "rollout": {
                "engine": {"name": "hf", "batch_size": 8},
                "prompts_per_step": 2,
                "group_size": 4,
                "max_new_tokens": 16,
            },
            "prompt": {"max_prompt_tokens": 16},
            "model": {"dtype": "bfloat16"},
            "trainer": {
                "engine": engine,
                "dtype": "bfloat16",
                "max_tokens_per_micro_batch": 64,
                "logits_chunk_tokens": 32,
                **trainer,
            },
        }
    )


# -- the arithmetic --------------------------------------------------------------------------------------------


def test_parameter_count_of_a_small_moe():
    shape = ModelShape.from_hf(MOE)
    # attention per layer: q 16x32, k and v 16x16 each, o 32x16, two RMSNorms 2x16, q/k norms 2x8
    attention = 16 * 32 + 2 * 16 * 16 + 32 * 16 + 2 * 16 + 2 * 8
    experts = 4 * 3 * 16 * 12  # per MoE layer
    router = 4 * 16
    total = 100 * 16 * 2 + 16 + 2 * (attention + router + experts)
    assert shape.parameters() == total == 11120
    assert shape.expert_parameters() == 2 * experts
    assert ModelShape.from_hf(DENSE).parameters() == 100 * 16 + 16 + 3 * (attention + 3 * 16 * 40)


@pytest.mark.parametrize("hf", [MOE, DENSE], ids=["moe", "dense"])
def test_parameter_count_matches_transformers(hf):
    """The count is that of the real model classes (built from the config, random init, nothing downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf))
    assert ModelShape.from_hf(hf).parameters() == sum(p.numel() for p in model.parameters())


def test_breakdown_of_one_process_bf16():
    shape = ModelShape.from_hf(MOE)
    parts = estimate(run_config(), shape, world=1).parts
    p = 11120
    assert parts["weights"] == 4 * p and parts["gradients"] == 4 * p and parts["optimizer"] == 8 * p
    assert parts["master_copy"] == 0 and parts["gathered"] == 0 and parts["communication"] == 0
    assert parts["weight_copies"] == 2 * p  # no checkpointing: every expert's bf16 copy is saved too
    # per token and layer: 4 fp32 [h]; bf16: 2h + 4q + 4kv; MoE: k (2h + 4 Im) in bf16 + E fp32 router values
    layer = 4 * 16 * 4 + 2 * (2 * 16 + 4 * 32 + 4 * 16) + 2 * (2 * 16 + 4 * 12) * 2 + 4 * 4
    assert parts["activations"] == 64 * 2 * layer
    assert parts["logits"] == 32 * 100 * 4 * 4
    assert parts["reference"] == 0
    # hf rollout: bf16 copy + KV cache of min(batch_size 8, 2 x 4 rows) x (16 + 16) tokens x 2 layers x k, v
    assert parts["rollout"] == 2 * p + 8 * 32 * 2 * 2 * 16 * 2
    assert parts["runtime"] == GiB
    assert estimate(run_config(), shape).total() == sum(parts.values())


def test_reference_model_adds_the_engines_weights():
    shape = ModelShape.from_hf(MOE)
    config = run_config()
    with_kl = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"kl_coef": 0.1})})
    plain, kl = estimate(config, shape).parts, estimate(with_kl, shape).parts
    assert kl["reference"] == plain["weights"] + plain["master_copy"] == 4 * 11120


def test_a_teacher_adds_its_own_weights_in_the_engines_layout():
    shape, teacher = ModelShape.from_hf(MOE), ModelShape.from_hf(DENSE)
    plain = estimate(run_config(), shape).parts
    with_teacher = estimate(run_config(), shape, teacher=teacher).parts
    assert plain["teacher"] == 0
    assert with_teacher["teacher"] == 4 * teacher.parameters()  # fp32 master weights, no gradients or optimizer
    assert {k: v for k, v in with_teacher.items() if k != "teacher"} == {
        k: v for k, v in plain.items() if k != "teacher"
    }
    zero3 = estimate(run_config(engine={"name": "deepspeed", "zero_stage": 3}), shape, world=2, teacher=teacher).parts
    assert zero3["teacher"] == 4 * (teacher.parameters() // 2)  # partitioned as the policy's weights are


def test_zero_stages_partition_over_the_processes():
    shape, p, n = ModelShape.from_hf(MOE), 11120, 4
    parts = {
        s: estimate(run_config(engine={"name": "deepspeed", "zero_stage": s}), shape, world=n).parts for s in range(4)
    }
    assert (parts[0]["weights"], parts[0]["gradients"], parts[0]["optimizer"]) == (4 * p, 4 * p, 8 * p)
    assert (parts[1]["gradients"], parts[1]["optimizer"], parts[1]["master_copy"]) == (4 * p, 8 * p // n, 4 * p // n)
    assert (parts[2]["gradients"], parts[2]["optimizer"]) == (4 * p // n, 8 * p // n)
    assert parts[2]["master_copy"] == 4 * p // n
    assert (parts[3]["weights"], parts[3]["master_copy"]) == (4 * p // n, 0)
    largest = 16 * 32 + 2 * 16 * 16 + 32 * 16 + 2 * 16 + 2 * 8 + 4 * 16 + 4 * 3 * 16 * 12  # a layer > the embedding
    assert parts[3]["gathered"] == 4 * 2 * largest and parts[2]["gathered"] == 0
    assert all(parts[s]["communication"] == 4 * p for s in range(4))  # the bucket is larger than the model
    totals = [sum(parts[s].values()) for s in range(4)]
    assert totals[1] < totals[0] and totals[2] < totals[1] and totals[3] < totals[2]


def test_expert_parallelism_splits_the_experts():
    shape, p, pe = ModelShape.from_hf(MOE), 11120, 2 * 4 * 3 * 16 * 12
    engine = {"name": "deepspeed", "zero_stage": 0, "moe": "deepspeed", "ep_size": 2}
    parts = estimate(run_config(engine=engine), shape, world=2).parts
    assert parts["weights"] == 4 * (p - pe + pe // 2) and parts["optimizer"] == 8 * (p - pe + pe // 2)


def test_activation_checkpointing_lowers_activations():
    shape = ModelShape.from_hf(MOE)
    plain = estimate(run_config(), shape).parts
    checkpointed = estimate(run_config(activation_checkpointing=True), shape).parts
    layer = plain["activations"] // (64 * 2)
    assert checkpointed["activations"] == 64 * 2 * 16 * 4 + 64 * layer < plain["activations"]
    non_expert, one_layer_of_experts = 11120 - 2 * 4 * 3 * 16 * 12, 4 * 3 * 16 * 12
    assert checkpointed["weight_copies"] == 2 * (non_expert + one_layer_of_experts)


def test_vllm_share_is_a_fraction_of_the_device():
    shape = ModelShape.from_hf(MOE)
    config = build_config({"rollout": {"engine": {"name": "vllm", "gpu_memory_utilization": 0.25}}})
    memory = estimate(config, shape)
    assert memory.parts["rollout"] == 0 and memory.device_fraction == 0.25
    assert memory.total(80 * GB) == memory.total() + 20 * GB
    assert "+ vLLM's share" in memory.lines()[-1]
    bytes_config = build_config({"rollout": {"engine": {"name": "vllm", "kv_cache_memory_bytes": 1000}}})
    assert estimate(bytes_config, shape).parts["rollout"] == 1000 + 11120 * 4  # model.dtype float32


def test_parse_bytes():
    assert parse_bytes("80GB") == 80 * 10**9 == parse_bytes("80e9") == parse_bytes("80 gb")
    assert parse_bytes("80GiB") == 80 * 2**30 and parse_bytes("1.5TB") == 1.5e12 and parse_bytes("512") == 512
    for bad in ("80 parsecs", "GB", "-1GB", "0", ""):
        with pytest.raises(ValueError):
            parse_bytes(bad)


# -- the preflight and the command line ------------------------------------------------------------------------


def big_tiny_config(folder: Path, **trainer) -> Path:
    """A cold-started model.tiny of GPU-like width: its activations alone exceed a gigabyte."""
    config = {
        "output_dir": str(folder / "out"),
        "model": {
            "tiny": {
                "hidden_size": 2048,
                "num_hidden_layers": 8,
                "num_attention_heads": 16,
                "num_key_value_heads": 4,
                "head_dim": 128,
                "intermediate_size": 4096,
                "moe_intermediate_size": 512,
                "num_experts": 8,
                "num_experts_per_tok": 2,
            }
        },
        "trainer": {"dtype": "bfloat16", **trainer},
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_preflight_refuses_a_config_that_cannot_fit(tmp_path):
    registry = default_registry()
    config = load_config(big_tiny_config(tmp_path, device_memory="4GB"), registry=registry)
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    text = str(err.value)
    assert "trainer.device_memory: 4.0 GB per GPU is less than the run's estimated" in text
    for field in (
        "trainer.max_tokens_per_micro_batch",
        "trainer.activation_checkpointing: true",
        "trainer.engine: {name: deepspeed} partitioning them",
        "activations",
        "total",
    ):
        assert field in text
    assert preflight(config, registry, device_memory=1000 * GB) is not None  # the flag replaces the field


def test_train_makes_the_same_check_before_it_starts(tmp_path, monkeypatch, capsys):
    from rlzoo.cli import main

    path = big_tiny_config(tmp_path, device_memory="4GB")
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert "trainer.device_memory: 4.0 GB per GPU is less than" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before the run folder exists


def test_config_check_through_the_real_cli_rejects_naming_the_fields(tmp_path):
    path = big_tiny_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "config", "check", str(path), "--device-memory", "1GB"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and proc.stdout == ""
    assert proc.stderr.startswith("error: invalid config")
    assert "--device-memory: 1.0 GB per GPU is less than" in proc.stderr
    assert "trainer.max_tokens_per_micro_batch" in proc.stderr and "estimate per rank:" in proc.stderr


def test_config_check_flag_errors_and_the_printed_estimate(tmp_path, monkeypatch, capsys):
    from rlzoo.cli import main

    path = big_tiny_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "check", str(path), "--device-memory", "80 parsecs"]) == 1
    assert "--device-memory: '80 parsecs' is not a memory size" in capsys.readouterr().err
    assert main(["config", "check", str(path), "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# GPU memory per rank, estimated") and "fits 80.0 GB (--device-memory)" in out
    assert yaml.safe_load(out)["trainer"]["dtype"] == "bfloat16"  # the estimate is YAML comments
    assert (
        main(
            [
                "config",
                "check",
                str(REPO / "examples" / "gspo_tiny_moe.yaml"),
                "--set",
                f"output_dir={tmp_path / 'tiny'}",
            ]
        )
        == 0
    )
    assert "#" not in capsys.readouterr().out.split("\n")[0]  # a CPU-sized model without a device: no estimate


# -- the GPU recipes -------------------------------------------------------------------------------------------


def recipe_checks(recipe: Path) -> list[argparse.Namespace]:
    """The recipe's ``# check:`` lines, read as scripts/gpu_memory_table.py reads them."""
    import runpy

    return runpy.run_path(str(REPO / "scripts" / "gpu_memory_table.py"))["checks"](recipe)


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_gpu_recipe_fits_its_device_memory(recipe):
    """Each recipe names its GPU's memory and fits it on every process count it is checked for; all but the 30B
    ones name an 80 GB GPU. The in-process 30B ones cannot: every rank holds a 61 GB rollout copy of the model. The
    server-pool one (``*_servers``) holds none on the trainer's GPUs, and fits 80 GB on 16 ranks."""
    registry = default_registry()
    config = load_config(recipe, registry=registry)
    device = parse_bytes(config.trainer.device_memory)
    servers = recipe.stem.endswith("_servers")
    engine = "vllm-server" if servers else "vllm"
    assert config.trainer.activation_checkpointing and config.rollout.engine.name == engine
    assert config.rollout.per_rank is not servers  # in-process: an engine per rank; servers: rank 0 calls the pool
    for args in recipe_checks(recipe):
        checked = load_config(recipe, args.set, registry)
        shape = ModelShape.from_hf(json.loads((REPO / args.model_config).read_text()))
        memory = estimate(checked, shape, args.processes)
        limit = parse_bytes(checked.trainer.device_memory)
        assert memory.fits(limit), "\n".join(memory.lines(limit))
        if servers:  # nothing of vLLM's on the trainer's GPUs; the pool's lines say what each server holds
            assert memory.rollout_weights == 0 and memory.parts["rollout"] == 0 and memory.rollout_pool
            assert limit == 80 * GB or args.processes == 8
        elif "30b" in recipe.stem:  # no gpu_memory_utilization fits: vLLM's weights alone leave too little
            vllm_weights = memory.rollout_weights
            assert memory.total() + vllm_weights > 80 * GB and vllm_weights > 60 * GB
        else:
            assert device == 80 * GB


def test_the_docs_table_is_the_scripts_output():
    """docs/gpu.md's table of the recipes' estimates is what scripts/gpu_memory_table.py prints today."""
    import runpy

    rows = runpy.run_path(str(REPO / "scripts" / "gpu_memory_table.py"))["rows"]()
    docs = (REPO / "docs" / "gpu.md").read_text()
    assert len(rows) > len(RECIPES)
    missing = [row for row in rows if row not in docs]
    assert not missing, "docs/gpu.md is stale; rerun python scripts/gpu_memory_table.py:\n" + "\n".join(missing)
