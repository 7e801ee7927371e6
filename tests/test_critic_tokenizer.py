"""``algorithm.critic.model`` reads the policy's token ids, whatever the policy (issue 36): its folder's
``vocab_size`` and ``tokenizer.json`` are compared with a model.path policy's and with a tiny policy's character
tokenizer alike (:func:`rlzoo.rl.critic.critic_rule`). Through the real CLI: tests/test_fault_table_config.py."""

from __future__ import annotations

import json
from pathlib import Path

from folder_testlib import write_weights

from rlzoo.config.resolution import build_config
from rlzoo.errors import ConfigError
from rlzoo.models.tokenizer import char_vocab
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry

ARITHMETIC = "0123456789+-*="  # the arithmetic task's alphabet: the tiny policy's tokenizer


def model_folder(root: Path, vocab: dict[str, int], vocab_size: int | None = None) -> str:
    """A model folder with a character-level ``tokenizer.json`` and the weights its ``config.json`` describes (the
    preflight reads their headers, and compares them with the config)."""
    root.mkdir(parents=True)
    hf = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 256,
        "vocab_size": len(vocab) if vocab_size is None else vocab_size,
    }
    hf.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)  # MoE, as the default tiny policy
    (root / "config.json").write_text(json.dumps(hf))
    write_weights(root)
    tokenizer = {"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": []}
    (root / "tokenizer.json").write_text(json.dumps(tokenizer))
    return str(root)


def critic_problems(tmp_path: Path, critic: str, **extra) -> list[str]:
    registry = default_registry()
    data = {"output_dir": str(tmp_path / "run"), "algorithm": {"preset": "ppo", "critic": {"model": critic}}, **extra}
    try:
        preflight(build_config(data, registry=registry), registry)
    except ConfigError as err:
        return [message for loc, message in err.problems if loc == "algorithm.critic.model"]
    return []


def test_a_tiny_policys_critic_on_another_tokenizer_is_refused(tmp_path):
    other = char_vocab("abcdefghijklmn")  # as many tokens as the policy's, other characters
    assert len(other) == len(char_vocab(ARITHMETIC))
    (message,) = critic_problems(tmp_path, model_folder(tmp_path / "critic", other))
    assert (
        "differs from the policy's (the tiny model's character tokenizer, built from the alphabet of task "
        "'arithmetic')" in message
    )
    assert "28 tokens differ, e.g. '*': absent in the critic's, id 3 in the policy's" in message


def test_a_tiny_policys_critic_of_another_vocab_size_is_refused(tmp_path):
    folder = model_folder(tmp_path / "critic", char_vocab(ARITHMETIC), vocab_size=40)
    (message,) = critic_problems(tmp_path, folder)
    assert f"{folder} has vocab_size 40 but the policy 17" in message


def test_a_tiny_policys_critic_on_its_own_tokenizer_passes(tmp_path):
    """A critic cold-started on the same task (the same character tokenizer), as rlzoo would build it."""
    assert critic_problems(tmp_path, model_folder(tmp_path / "critic", char_vocab(ARITHMETIC))) == []


def test_a_folder_policys_critic_is_compared_token_by_token(tmp_path):
    policy = model_folder(tmp_path / "policy", char_vocab("abcdefghijklmn"))
    extra = {"model": {"path": policy}, "cold_start": {"enabled": False}}
    same = model_folder(tmp_path / "same", char_vocab("abcdefghijklmn"))
    assert critic_problems(tmp_path, same, **extra) == []
    vocab = char_vocab("abcdefghijklmn")
    swapped = model_folder(tmp_path / "swapped", {**vocab, "a": vocab["n"], "n": vocab["a"]})  # two ids swapped
    (message,) = critic_problems(tmp_path, swapped, **extra)
    assert (
        f"the tokenizer of {swapped} differs from the policy's (the tokenizer.json of {policy}): 2 tokens differ"
        in message
    )
    bigger = model_folder(tmp_path / "bigger", char_vocab("abcdefghijklmn"), vocab_size=30)
    assert "has vocab_size 30 but the policy 17" in critic_problems(tmp_path, bigger, **extra)[0]
