"""Policies: tiny locally built models and loading of real Hugging Face model folders."""

from rlzoo.models.tiny import build_tiny_model, load_model, load_value_model, save_model, tiny_model_config
from rlzoo.models.tokenizer import build_char_tokenizer

__all__ = ["build_char_tokenizer", "build_tiny_model", "load_model", "load_value_model", "save_model", "tiny_model_config"]
