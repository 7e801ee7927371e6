"""Tiny Qwen3 / Qwen3-MoE policies built from a transformers config with random weights.

Sizes come from the run config and must meet :meth:`rlzoo.config.schema.TinyModelConfig.shape_problems` (checked here
and, with the engine-dependent rules, by :mod:`rlzoo.preflight.checks` before a run starts); the vocabulary is the
tokenizer's length. transformers is imported on first use: its model classes take seconds to import, and the
engines plugin imports this module during plugin discovery.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlzoo.config.schema import TinyModelConfig
from rlzoo.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen3Config, Qwen3MoeConfig


def tiny_model_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config | Qwen3MoeConfig:
    return tiny_config_for_vocab(cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)


def tiny_config_for_vocab(cfg: TinyModelConfig, vocab_size: int, pad_token_id: int = 0, eos_token_id: int = 0) -> Qwen3Config | Qwen3MoeConfig:
    """The transformers config of ``cfg`` over a vocabulary of ``vocab_size`` ids."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    problems = cfg.shape_problems()
    if problems:
        raise ConfigError([(f"model.tiny.{field}", message) for field, message in problems])
    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
        torch_dtype="float32",
    )
    if cfg.architecture == "qwen3":
        return Qwen3Config(**common)
    return Qwen3MoeConfig(
        **common,
        moe_intermediate_size=cfg.moe_intermediate_size,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=False,
    )


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(cfg, tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Write an HF folder (safetensors weights, config, tokenizer) that transformers and vLLM both load."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def load_model(directory: str | Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a Hugging Face model folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_value_model(directory: str | Path, dtype: str = "float32", seed: int = 0) -> PreTrainedModel:
    """A critic: the model of ``directory`` with one output per position (``AutoModelForTokenClassification``,
    ``num_labels = 1``, as verl's critic). From a causal LM folder the transformer's weights are the folder's and
    the value head is new, initialised from ``seed``; from a critic's own folder (saved by a run) the head is
    the saved one. The head's dropout is off: a value is a regression target, not a classifier's feature."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a Hugging Face model folder (no config.json)")
    config = AutoConfig.from_pretrained(directory)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: score.weight" is the point, not a problem
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForTokenClassification.from_pretrained(directory, config=config, dtype=getattr(torch, dtype))
    finally:
        hf_logging.set_verbosity(verbosity)
    return model
