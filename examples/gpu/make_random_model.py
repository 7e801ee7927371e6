"""Build a random-init model folder from a config.json and a tokenizer folder (for GPU smoke runs; no download).

    python examples/gpu/make_random_model.py examples/gpu/models/qwen3-moe-small/config.json TOKENIZER_DIR OUT_DIR

TOKENIZER_DIR is any folder holding the tokenizer files (with chat template) of the model family, e.g. a Qwen3
download; the model's vocab_size becomes the tokenizer's length. The weights are random: such a model earns no
reward on math; it exercises the engines (speed, memory, weight sync), not learning.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def main(config_json: str, tokenizer_dir: str, out_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.from_pretrained(str(Path(config_json).parent))
    config.vocab_size = len(tokenizer)
    # the family's special-token ids may lie outside another tokenizer's vocabulary: take the tokenizer's
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, key, getattr(tokenizer, key))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    print(f"{out_dir}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters (random init)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
