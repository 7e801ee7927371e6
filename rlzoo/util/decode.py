"""Response text from sampled token ids: the one decode path that training and evaluation share.

A response is decoded as a whole sequence (``tokenizer.decode(ids, skip_special_tokens=True)``), never token by
token: with a byte-level BPE tokenizer a character can span several tokens, and joining per-token pieces would
give the verifier a different string (replacement characters) than a whole-sequence decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"


def response_text(tokenizer: Any, response_ids: Sequence[int]) -> str:
    """The text a verifier scores for one response (special tokens such as end-of-sequence dropped)."""
    return tokenizer.decode(list(response_ids), skip_special_tokens=True)


def token_char_ends(tokenizer: Any, response_ids: Sequence[int]) -> list[int]:
    """For each response token, where its text ends in :func:`response_text` (an exclusive character offset).

    The offset is the length of the decoded prefix ``ids[:t + 1]``; a prefix that stops inside a multi-byte
    character decodes with trailing replacement characters, which are not counted, so a character belongs to the
    token that completes it. Offsets never decrease and never pass the whole text. Costs one decode per token:
    only process rewards (step spans placed on tokens) need it.
    """
    ids = list(response_ids)
    limit = len(response_text(tokenizer, ids))
    ends, last = [], 0
    for t in range(1, len(ids) + 1):
        prefix = response_text(tokenizer, ids[:t])
        last = min(max(last, len(prefix.rstrip(REPLACEMENT))), limit)
        ends.append(last)
    return ends
