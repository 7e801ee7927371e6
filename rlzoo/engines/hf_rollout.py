"""Rollouts with transformers ``generate`` on a private copy of the policy, synced after each optimizer step."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from pydantic import Field

from rlzoo.engines.base import EngineContext, Generation, RolloutEngine, SamplingSettings
from rlzoo.interfaces import Params
from rlzoo.models.weights import load_checkpoint_weights


class HFRolloutEngine(RolloutEngine):
    """transformers generate(): simple, exact, slow; the fallback where vLLM is not installed."""

    name = "hf"

    class Params(Params):
        batch_size: int = Field(256, ge=1, description="sequences generated per generate() call")

    def start(self, context: EngineContext) -> None:
        from rlzoo.models import load_model

        self.context = context
        self.model, _ = load_model(context.model_dir, context.dtype)
        self.model.eval()
        self.model.requires_grad_(False)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        rows = [(i, p) for i, p in enumerate(prompts) for _ in range(sampling.n)]
        out: list[list[Generation]] = [[] for _ in prompts]
        greedy = sampling.temperature == 0
        with torch.random.fork_rng():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for chunk_start in range(0, len(rows), self.params.batch_size):
                chunk = rows[chunk_start : chunk_start + self.params.batch_size]
                for (index, prompt), generation in zip(chunk, self._generate_chunk([p for _, p in chunk], sampling, greedy)):
                    out[index].append(generation)
        return out

    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingSettings, greedy: bool) -> list[Generation]:
        pad = self.context.pad_token_id
        eos = self.context.eos_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate() expects
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        result = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,  # raw logits, before temperature / top-p: log-probs at temperature 1
            **kwargs,
        )
        new_tokens = result.sequences[:, width:]
        logits = torch.stack(result.logits, dim=1).float()  # [B, steps, V]
        logp = torch.log_softmax(logits, dim=-1).gather(2, new_tokens.unsqueeze(-1)).squeeze(-1)
        generations = []
        for row, prompt in enumerate(prompts):
            tokens = new_tokens[row].tolist()
            finished = eos in tokens
            length = tokens.index(eos) + 1 if finished else len(tokens)
            generations.append(Generation(list(prompt), tokens[:length], logp[row, :length].tolist(), finished))
        return generations

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_checkpoint_weights(self.model, named_tensors)
