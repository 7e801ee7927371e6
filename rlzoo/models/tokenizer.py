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


def vocab_difference(vocab: dict[str, int], policy: dict[str, int] | None, whose: str) -> str | None:
    """How ``vocab`` (a teacher's, a critic's: ``whose``) maps tokens to other ids than the policy's, as a phrase
    (``3 tokens differ, e.g. 'x': id 4 in the critic's, absent in the policy's``); ``None`` when they agree or the
    policy's is unknown."""
    if policy is None:
        return None
    differ = sorted(token for token in vocab.keys() | policy.keys() if vocab.get(token) != policy.get(token))
    if not differ:
        return None
    example = differ[0]
    ids = [f"id {ids[example]}" if example in ids else "absent" for ids in (vocab, policy)]
    return f"{len(differ)} tokens differ, e.g. {example!r}: {ids[0]} in the {whose}'s, {ids[1]} in the policy's"


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
