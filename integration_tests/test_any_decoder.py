"""Any decoder-only causal LM folder runs as ``model.path``, not only the Qwen3 models rlzoo builds: a tiny random
Llama with tied input and output embeddings (SmolLM2's architecture; the real SmolLM2 runs in
test_real_model.py) and a tiny dense Qwen3, on both rollout engines, both training engines (DeepSpeed ZeRO-3, which
partitions the tied weight), LoRA, the critic, the teacher, a Llama reward model, and ``rlzoo export``.

Tied embeddings are the case that breaks naive code: weight sync must send ``embed_tokens`` once (vLLM ties
``lm_head`` to it), checkpoints and exports must keep one copy, and LoRA must leave the tie alone."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs_testlib import assert_finite_metrics

from rlzoo.config.loading import read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.models import build_char_tokenizer, load_model, save_model
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.run import train

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("vllm", "deepspeed")),
    reason="needs vLLM (bash scripts/install.sh --vllm) and DeepSpeed",
)
ALPHABET = "0123456789+-*="


def tiny_folder(root: Path, architecture: str, head: str = "causal") -> Path:
    """A random-init model of ``architecture`` (llama: tied embeddings) over the arithmetic task's characters."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig, Qwen3Config

    tokenizer = build_char_tokenizer(ALPHABET)
    sizes = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    config = LlamaConfig(**sizes, tie_word_embeddings=True) if architecture == "llama" else Qwen3Config(**sizes)
    torch.manual_seed(0)
    if head == "reward":
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    return save_model(model, tokenizer, root / f"{architecture}-{head}")


def overrides(run_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """Two short steps; a random model never answers right, so a format reward (a ``+`` anywhere in the response,
    about a third of random responses) splits each group and every run has a gradient to follow."""
    return [
        f"model.path={model_dir}",
        "cold_start.enabled=false",
        f"output_dir={run_dir}",
        "verifier={name: regex, pattern: '[+]', fullmatch: false}",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "train.steps=2",
        "train.eval_every=2",
        "train.eval_prompts=8",
        "train.checkpoint_every=2",
        "algorithm.minibatches_per_rollout=2",
        *extra,
    ]


def run_config(run_dir: Path, model_dir: Path, *extra: str):
    return build_config(read_yaml(EXAMPLE), overrides(run_dir, model_dir, *extra))


def train_in_a_process(run_dir: Path, model_dir: Path, *extra: str) -> Path:
    """``rlzoo train`` as a subprocess: DeepSpeed ZeRO-3 keeps process-group state a later in-process ZeRO-3 run
    (another test module) would trip over."""
    sets = [arg for item in overrides(run_dir, model_dir, *extra) for arg in ("--set", item)]
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "train", str(EXAMPLE), *sets], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def saved_names(model_dir: Path) -> set[str]:
    from safetensors import safe_open

    names = set()
    for file in model_dir.glob("*.safetensors"):
        with safe_open(file, "pt") as weights:
            names |= set(weights.keys())
    return names


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("models"), "llama")


@ENGINES
@pytest.mark.parametrize(  # the torch engine's tied embedding: also the hf + torch test below; torch + vLLM slow
    "trainer",
    ["{name: deepspeed, zero_stage: 3}", pytest.param("{name: torch}", marks=pytest.mark.slow)],
    ids=["zero3", "torch"],
)
def test_tied_llama_trains_on_vllm_and_checkpoints_one_embedding(tmp_path, llama, trainer):
    run_dir = train_in_a_process(tmp_path / "run", llama, f"trainer.engine={trainer}", "trainer.lr=0.01")
    rows = [r for r in assert_finite_metrics(run_dir, 2) if "reward/mean" in r]
    assert rows[0]["advantage/abs_mean"] > 0
    # weight sync reaches vLLM through the tie: at step 1 vLLM samples from the trained policy, so its log-probs
    # match the training engine's old pass; a sync that dropped the tied head would leave a wide gap
    assert rows[1]["mismatch/abs_logp_diff"] < 1e-3, rows
    model_dir = latest_checkpoint(run_dir) / "model"
    assert "lm_head.weight" not in saved_names(model_dir)
    policy, _ = load_model(model_dir)
    assert policy.lm_head.weight.data_ptr() == policy.model.embed_tokens.weight.data_ptr()
    start, _ = load_model(llama)
    assert not torch.equal(policy.model.embed_tokens.weight, start.model.embed_tokens.weight)  # the tie trained


def test_dense_qwen3_and_tied_llama_on_hf_and_torch_with_lora_and_export(tmp_path, llama):
    qwen = tiny_folder(tmp_path, "qwen3")
    assert_finite_metrics(
        train(
            run_config(tmp_path / "qwen", qwen, "rollout.engine={name: hf}", "trainer.engine={name: torch}"),
            progress=False,
        ),
        2,
    )
    run_dir = train(
        run_config(
            tmp_path / "lora",
            llama,
            "rollout.engine={name: hf}",
            "trainer.engine={name: torch}",
            "trainer.lr=0.01",
            "model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}",
        ),
        progress=False,
    )
    assert_finite_metrics(run_dir, 2)
    out = tmp_path / "merged"
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "export", str(latest_checkpoint(run_dir)), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lm_head.weight" not in saved_names(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    merged, _ = load_model(out)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()


def test_tied_llama_as_critic_teacher_and_reward_model(tmp_path, llama):
    reward_model = tiny_folder(tmp_path, "llama", head="reward")
    base = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]
    critic = train(run_config(tmp_path / "ppo", llama, *base, "algorithm.preset=ppo"), progress=False)
    rows = assert_finite_metrics(critic, 2)
    assert all("critic/vf_loss" in r for r in rows if "reward/mean" in r)
    teacher = train(
        run_config(
            tmp_path / "distill",
            llama,
            *base,
            f"teacher.model={llama}",
            "algorithm.preset=null",
            "algorithm.ratio={name: token}",
            "algorithm.advantage={name: reverse-kl, kl_coef: 1.0, task: null}",
        ),
        progress=False,
    )
    rows = assert_finite_metrics(teacher, 2)
    # the teacher is the policy's own folder, so its log-probs equal the policy's (the tied head loaded as such)
    kl = [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r]
    assert len(kl) == 2 and max(map(abs, kl)) < 1e-5, kl
    scored = train(
        run_config(tmp_path / "rm", llama, *base, f"verifier={{name: reward-model, path: {reward_model}}}"),
        progress=False,
    )
    rows = assert_finite_metrics(scored, 2)
    assert len({r["reward/mean"] for r in rows if "reward/mean" in r}) > 1  # a real score, not a constant
