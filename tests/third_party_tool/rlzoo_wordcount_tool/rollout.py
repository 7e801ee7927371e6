"""``word-count-caller``: transformers generate, except that an episode's first turn is a scripted call of
``word-count``, so a test sees the tool called through the whole episode loop without training a model to call it.

A prompt whose text holds no ``<tool_call>`` yet (an episode's first turn) gets, for each of its ``n`` samples,
``<tool_call>{"name": "word-count", "arguments": {"text": <text>}}</tool_call>`` (the ``hermes`` format) and
end-of-sequence, with the model's own log-probs of those tokens (one forward), cut at ``max_new_tokens`` like any
response. Every other prompt (a later turn: the call, the observation appended by the episode runner) is sampled
by ``hf``; with ``transcript_path`` its decoded text is appended to that file, so a test can read what the model saw.
For plain-text prompts only: a chat template's tool instructions mention ``<tool_call>`` in every prompt.
"""

from __future__ import annotations

import json
import threading

import torch
from pydantic import Field

from rlzoo.engines import EngineContext, Generation, SamplingSettings
from rlzoo.engines.hf_rollout import HFRolloutEngine

_LOCK = threading.Lock()


class WordCountCaller(HFRolloutEngine):
    """transformers generate(), every episode's first turn a scripted word-count call (a test engine)."""

    name = "word-count-caller"
    can_record_routing = False  # the scripted turn is not decoded by generate(): no routing to record

    class Params(HFRolloutEngine.Params):
        text: str = Field("one two three four", description="the text every scripted call asks to count")
        transcript_path: str | None = Field(None, description="append the decoded context of every later turn here")

    def start(self, context: EngineContext) -> None:
        from transformers import AutoTokenizer

        super().start(context)
        self.tokenizer = AutoTokenizer.from_pretrained(context.model_dir)

    def call_text(self) -> str:
        body = json.dumps({"name": "word-count", "arguments": {"text": self.params.text}})
        return f"<tool_call>{body}</tool_call>"

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        texts = [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        later = [i for i, text in enumerate(texts) if "<tool_call>" in text]
        out: list[list[Generation]] = [[] for _ in prompts]
        if later:
            if self.params.transcript_path is not None:
                with _LOCK, open(self.params.transcript_path, "a") as f:
                    f.writelines(json.dumps(texts[i]) + "\n" for i in later)
            for i, group in zip(later, super().generate([prompts[i] for i in later], sampling), strict=True):
                out[i] = group
        call = list(self.tokenizer(self.call_text(), add_special_tokens=False)["input_ids"]) + [
            self.context.eos_token_id
        ]
        for i, prompt in enumerate(prompts):
            if i not in later:
                out[i] = [self._scripted(prompt, call, sampling.max_new_tokens) for _ in range(sampling.n)]
        return out

    def _scripted(self, prompt: list[int], call: list[int], max_new_tokens: int) -> Generation:
        ids = call[:max_new_tokens]
        logits = self.model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        return Generation(list(prompt), ids, logprobs.tolist(), finished=len(ids) == len(call))
