"""A model folder whose ``config.json`` does not describe its weights (:mod:`rlzoo.models.folder_tensors`): refused
from the safetensors headers and a meta-device model, for the policy, a critic, a teacher and a reward model alike,
by ``rlzoo config check`` and by ``rlzoo train`` before anything starts (both in-process, through the CLI's entry
function).

Each folder is a whole tiny model saved by transformers, then its ``config.json`` edited as a user might: one layer
more or less than the weights hold, another ``moe_intermediate_size``, another architecture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rlzoo.cli import main
from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.models.folder import ModelFolder

ALPHABET = "0123456789+-*="  # the arithmetic task's: the folders are on the run's character tokenizer
TOKENIZER = build_char_tokenizer(ALPHABET)
DENSE = TinyModelConfig(architecture="qwen3", hidden_size=32, head_dim=16, intermediate_size=64)
MOE = TinyModelConfig(hidden_size=32, head_dim=16, moe_intermediate_size=32, num_experts=4)
MISSING_Q = "model.layers.2.self_attn.q_proj.weight"
T5 = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 32,
    "vocab_size": 16,
    "num_layers": 1,
    "num_heads": 2,
    "d_kv": 16,
    "d_ff": 64,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """``dense`` and ``moe`` causal LMs, ``rm`` a one-label sequence classifier, each saved whole."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    root = tmp_path_factory.mktemp("folders")
    save_model(build_tiny_model(DENSE, TOKENIZER), TOKENIZER, root / "dense")
    save_model(build_tiny_model(MOE, TOKENIZER), TOKENIZER, root / "moe")
    reward = Qwen3ForSequenceClassification(
        Qwen3Config(
            vocab_size=len(TOKENIZER),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=1,
            pad_token_id=TOKENIZER.pad_token_id,
        )
    )
    save_model(reward, TOKENIZER, root / "rm")
    return root


def edited(models: Path, into: Path, source: str, replace: dict | None = None, **changes) -> Path:
    """A copy of ``models/source`` in ``into`` whose ``config.json`` has ``changes`` (``replace``: the whole file)."""
    folder = shutil.copytree(models / source, into / source)
    config = replace if replace is not None else json.loads((folder / "config.json").read_text())
    config.update(changes)
    if "num_hidden_layers" in changes:  # as transformers saves it: one layer type per layer
        config["layer_types"] = ["full_attention"] * changes["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_whole_folders_pass_for_every_role(models):
    assert ModelFolder.read(models / "dense").problems(tokenizer="", ids=True) == []
    assert ModelFolder.read(models / "moe").problems() == []
    assert ModelFolder.read(models / "dense").problems(head="value") == []  # the critic's new head, lm_head dropped
    assert ModelFolder.read(models / "rm").problems(head="score") == []


def test_a_config_of_more_layers_than_the_weights_names_the_missing_tensors(models, tmp_path):
    folder = edited(models, tmp_path, "dense", num_hidden_layers=3)
    [problem] = ModelFolder.read(folder).problems()
    assert problem.startswith(f"{folder}: config.json describes 11 tensors the weights lack: {MISSING_Q}, ")
    assert "(and 8 more)" in problem and "initialise them at random in Qwen3ForCausalLM" in problem


def test_a_config_of_fewer_layers_names_the_unexpected_tensors(models, tmp_path):
    folder = edited(models, tmp_path, "dense", num_hidden_layers=1)
    [problem] = ModelFolder.read(folder).problems()
    assert "the weights hold 11 tensors config.json does not describe: model.layers.1." in problem
    assert "transformers would drop them" in problem


def test_another_moe_intermediate_size_names_the_tensor_and_both_shapes(models, tmp_path):
    folder = edited(models, tmp_path, "moe", moe_intermediate_size=48)
    [problem] = ModelFolder.read(folder).problems()
    assert "tensors of another shape in the weights than config.json gives a causal LM: " in problem
    assert (
        "model.layers.0.mlp.experts.0.down_proj.weight is [32, 32] in the weights and [32, 48] by config.json"
        in problem
        and problem.startswith(f"{folder}: 24 tensors of another shape")
    )


def test_an_architecture_transformers_cannot_build_as_a_causal_lm_is_named(models, tmp_path):
    folder = edited(models, tmp_path, "dense", replace=dict(T5))
    [problem] = ModelFolder.read(folder).problems()
    assert "config.json model_type 't5' (architectures T5ForConditionalGeneration) is not a causal LM" in problem
    unknown = edited(models, tmp_path / "u", "dense", model_type="not-a-model")
    assert "config.json has model_type 'not-a-model'" in ModelFolder.read(unknown).problems()[0]


def test_a_reward_model_folder_as_a_policy_and_a_policy_as_a_reward_model(models):
    as_policy = ModelFolder.read(models / "rm").problems()
    assert any("describes 1 tensor the weights lack: lm_head.weight" in p for p in as_policy)
    assert any("the weights hold 1 tensor config.json does not describe: score.weight" in p for p in as_policy)
    as_reward = ModelFolder.read(models / "dense").problems(head="score")
    assert as_reward and "the weights lack: score.weight" in as_reward[0]


def test_tied_embeddings_are_one_tensor(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tied = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(TOKENIZER),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=64,
            tie_word_embeddings=True,
        )
    )
    folder = save_model(tied, TOKENIZER, tmp_path / "tied")
    assert ModelFolder.read(folder).problems() == []


# -- through the CLI, in-process ---------------------------------------------------------------------------------

BASE = {
    "output_dir": "out",
    "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "trainer": {"engine": {"name": "torch"}},
    "train": {"steps": 1, "eval_every": 1, "eval_prompts": 4, "checkpoint_every": 1},
}


def _config(folder: Path, **extra) -> str:
    config = {**BASE, **extra}
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    return str(folder / "run.yaml")


def _errors(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_train_refuses_weights_its_config_does_not_describe(models, tmp_path, capsys, monkeypatch):
    """`rlzoo train` on a folder whose config.json says 3 layers over the weights of 2: refused before anything
    starts, naming the first missing tensor (transformers would have trained on a randomly initialised layer)."""
    monkeypatch.chdir(tmp_path)
    folder = edited(models, tmp_path, "dense", num_hidden_layers=3)
    assert main(["train", _config(tmp_path, model={"path": str(folder)})]) == 1
    err = _errors(capsys)
    assert f"model.path: {folder}: config.json describes 11 tensors the weights lack: {MISSING_Q}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("role", ["policy", "critic", "teacher", "reward model"])
def test_config_check_refuses_a_config_that_does_not_describe_the_weights(role, models, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra: dict = {"model": {"path": str(models / "moe")}}
    if role == "policy":
        folder = edited(models, tmp_path, "moe", moe_intermediate_size=48)
        extra, field = {"model": {"path": str(folder)}}, "model.path"
    elif role == "critic":
        folder = edited(models, tmp_path, "moe", moe_intermediate_size=48)
        extra["algorithm"] = {"advantage": {"name": "gae"}, "critic": {"model": str(folder)}}
        field = "algorithm.critic.model"
    elif role == "teacher":
        folder = edited(models, tmp_path, "dense", num_hidden_layers=3)
        extra.update(algorithm={"advantage": {"name": "reverse-kl"}}, teacher={"model": str(folder)})
        field = "teacher.model"
    else:
        folder = edited(models, tmp_path, "rm", num_hidden_layers=2)
        extra["verifier"] = {"name": "reward-model", "path": str(folder)}
        field = "verifier.path"
    assert main(["config", "check", _config(tmp_path, **extra)]) == 1
    err = _errors(capsys)
    shown = {
        "policy": "in the weights and",
        "critic": "in the weights and",
        "teacher": MISSING_Q,
        "reward model": "the weights lack: model.layers.1.self_attn.q_proj.weight",
    }[role]
    line = next(line for line in err.splitlines() if line.strip().startswith(f"{field}: {folder}: "))
    assert shown in line, err


def test_config_check_refuses_a_t5_folder_and_a_t5_stand_in(models, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = edited(models, tmp_path, "dense", replace=dict(T5))
    assert main(["config", "check", _config(tmp_path, model={"path": str(folder)})]) == 1
    assert f"model.path: {folder}: config.json model_type 't5' (architectures T5ForConditionalGeneration)" in _errors(
        capsys
    )
    path = _config(tmp_path, model={"path": "elsewhere"})
    assert main(["config", "check", path, "--model-config", str(folder / "config.json")]) == 1
    assert "--model-config: " in (err := _errors(capsys)) and "model_type 't5'" in err
