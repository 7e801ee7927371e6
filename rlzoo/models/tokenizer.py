"""A character-level tokenizer built locally with the `tokenizers` library (nothing is downloaded).

Every character of the task's alphabet is one token; ``<pad>``, ``<eos>`` and ``<unk>`` are special tokens.
Saved in Hugging Face format so transformers and vLLM load it from the model folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

if TYPE_CHECKING:  # transformers takes seconds to import; plugin discovery reaches this module
    from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def char_vocab(alphabet: str) -> dict[str, int]:
    """Token -> id of the tokenizer :func:`build_char_tokenizer` builds for ``alphabet`` (the preflight compares it
    without building one)."""
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in sorted(set(alphabet)):
        vocab.setdefault(ch, len(vocab))
    return vocab


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=char_vocab(alphabet), unk_token=UNK))
    # one token per character, spaces included
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=None,
        clean_up_tokenization_spaces=False,
    )
