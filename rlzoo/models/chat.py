"""A byte-level BPE tokenizer with a Qwen3-style chat template, built locally (nothing is downloaded).

For tests and random-init smoke runs of the chat path: the real Qwen3 vocabulary is not shipped by any package
this project can install, so the BPE merges are trained here with the ``tokenizers`` library on the caller's texts
(``ByteLevel`` pre-tokenizer and decoder, as Qwen's), and the chat template below follows the structure of Qwen3's
(``<|im_start|>role\\n...<|im_end|>\\n`` turns; ``enable_thinking=False`` opens the assistant turn with an empty
``<think>`` block; ``tools=`` lists the tools' JSON schemas in a system turn, and a ``tool`` message is a user turn
holding ``<tool_response>...</tool_response>``, as Qwen's template renders them). It is a stand-in with Qwen's format, not Qwen's tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nCall a function by writing <tool_call>{\\\"name\\\": ..., \\\"arguments\\\": {...}}</tool_call>. '"
    " + 'The functions:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_chat_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts`` with ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos)
    and the Qwen3-style chat template; every byte is in the vocabulary, so any text encodes."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=ENDOFTEXT,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        chat_template=QWEN3_STYLE_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
