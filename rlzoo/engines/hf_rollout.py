"""Rollouts with transformers ``generate`` on a private copy of the policy, synced after each optimizer step.

With ``record_routing: true`` (MoE models) each :class:`Generation` also carries the experts the rollout used,
for Rollout Routing Replay (R3): hooks from :mod:`rlzoo.moe` record every forward of ``generate`` — the prefill
routes the (left-padded) prompt, each decode step routes the newest token — and the columns are joined into the
training engine's positions: ``[len(prompt) + len(response) - 1, layers, top_k]`` (left padding removed). The last
sampled token is never fed through the model, so it has no routing; ``rlzoo.moe.routing_for_batch`` marks its
position (and the padding) to be routed afresh at replay time, which changes no response log-prob.

LoRA (``model.lora``): with ``sync`` ``auto`` or ``adapter`` the run sends this engine the adapters (it loads any
target peft wraps; ``EngineContext.sends_adapters``, decided once by the run), so :meth:`start` wraps its model with peft on the same targets (``rlzoo.engines.lora.wrap``; the
adapters start at ``B = 0``: the base model) and :meth:`sync_adapter` loads each new adapter into it; sampling runs on
the transformers model itself, whose layers peft replaced in place. With ``merged`` the model is not wrapped at all:
the merged weights it receives by :meth:`sync_weights` are a plain model's, under a plain model's names, and a
wrapped model would add its adapters on top of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from pydantic import Field

from rlzoo.engines.base import Adapter, EngineContext, Generation, InFlightUpdates, RolloutEngine, SamplingSettings
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Params, RunFacts
from rlzoo.models.memory import ModelShape, RolloutMemory, kv_cache_bytes, policy_bytes
from rlzoo.models.weights import load_checkpoint_weights
from rlzoo.moe import stitch_routing

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig


class HFRolloutEngine(RolloutEngine):
    """transformers generate(): simple, exact, slow; the fallback where vLLM is not installed."""

    name = "hf"
    can_record_routing = True
    loads_adapters = True
    runs_per_rank = True  # an in-process model: one per rank is one more copy of the policy, nothing shared
    updates_in_flight = True  # generate() stops at a stopping criterion that watches for newer weights

    class Params(Params):
        batch_size: int = Field(256, ge=1, description="sequences generated per generate() call")
        record_routing: bool = Field(
            False,
            description="MoE: record the experts used while sampling into Generation.routing. The loop turns it on "
            "when the router policy needs it (R3); set it for the moe/rollout_train_disagreement diagnostics",
        )

    def memory(self, config: RunConfig, shape: ModelShape, world: int) -> RolloutMemory:
        """Its copy of the policy plus generate()'s KV cache: ``min(batch_size, the rows this rank samples)`` rows of
        ``prompt.max_prompt_tokens + rollout.max_new_tokens`` tokens."""
        r, weights = config.rollout, policy_bytes(config, shape)
        sampled = r.prompts_per_step * r.group_size // (world if r.per_rank else 1)
        rows = min(self.params.batch_size, max(sampled, 1))
        tokens = rows * ((config.prompt.max_prompt_tokens or 0) + r.max_new_tokens)
        return RolloutMemory(bytes=weights + kv_cache_bytes(config, shape, tokens), weights=weights)

    def memory_hint(self, run: RunFacts) -> str:
        return f"lower rollout.engine.batch_size (now {self.params.batch_size}); its copy of the weights stays"

    def start(self, context: EngineContext) -> None:
        from rlzoo.models import load_model

        self.context = context
        self.model, _ = load_model(context.model_dir, context.dtype)
        self.model.to(context.device)
        self._updates: InFlightUpdates | None = None  # rollout.partial: set by follow_updates
        self._peft = None
        if context.sends_adapters:  # the run's one rule (rlzoo.engines.lora.sends_adapters)
            from rlzoo.engines.lora import wrap

            # peft puts its layers into self.model itself; generate() and the routing hooks stay on self.model (the
            # PeftModel's own hooks would never fire: its generate() is the wrapped model's)
            self._peft = wrap(self.model, context.lora, context.seed)
        self.model.eval()
        self.model.requires_grad_(False)

    @property
    def wraps_adapters(self) -> bool:
        return self._peft is not None

    @property
    def records_routing(self) -> bool:
        return getattr(self, "_record_routing", self.params.record_routing)

    def set_record_routing(self, enabled: bool = True) -> None:
        """Turn routing capture on or off regardless of the config (the loop: when the router policy's source is
        ``"rollout"``). Raises ``rlzoo.moe.RoutingError`` on the next generate() if the model has no MoE router."""
        self._record_routing = enabled

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
                for (index, _prompt), generation in zip(
                    chunk, self._generate_chunk([p for _, p in chunk], sampling, greedy)
                ):
                    out[index].append(generation)
        return out

    def follow_updates(self, updates: InFlightUpdates | None) -> None:
        self._updates = updates

    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingSettings, greedy: bool) -> list[Generation]:
        """One batch of rows; with weight updates followed in flight, a generation stopped by newer weights loads
        them and goes on: the unfinished rows continue from their prefix (``continue``: a new prefill of prompt and
        tokens so far under the new weights, the remaining budget; their KV cache is not kept) or start again
        (``restart``). Rows advance in lockstep, so the unfinished ones have sampled the same number of tokens. A
        continued response's routing keeps, at every position, the experts of the weights that ran it first
        (:func:`rlzoo.moe.stitch_routing`): R3 replays for each token the routing of the version that sampled it."""
        updates = self._updates
        if updates is None:
            return self._generate_rows(prompts, sampling, greedy, None)
        interrupt = _Interrupt(updates.pending)
        version = updates.version()
        generations = self._generate_rows(prompts, sampling, greedy, interrupt)
        for generation in generations:
            generation.versions = [version] * len(generation.response_ids)
        if not interrupt.fired:
            return generations
        updates.load()
        budget = sampling.max_new_tokens
        rows = [i for i, g in enumerate(generations) if not g.finished and len(g.response_ids) < budget]
        if not rows:
            return generations
        if updates.mode == "restart":
            for i, again in zip(rows, self._generate_chunk([prompts[i] for i in rows], sampling, greedy)):
                generations[i] = again
            return generations
        done = len(generations[rows[0]].response_ids)
        rest = replace(sampling, max_new_tokens=sampling.max_new_tokens - done)
        prefixes = [prompts[i] + generations[i].response_ids for i in rows]
        for i, more in zip(rows, self._generate_chunk(prefixes, rest, greedy)):
            head = generations[i]
            generations[i] = Generation(
                list(prompts[i]),
                head.response_ids + more.response_ids,
                head.response_logprobs + more.response_logprobs,
                more.finished,
                versions=head.versions + more.versions,
            )
            if more.routing is not None:
                positions = len(prompts[i]) + len(generations[i].response_ids) - 1
                generations[i].routing = stitch_routing(head.routing, more.routing, positions)
        return generations

    def _generate_rows(
        self, prompts: list[list[int]], sampling: SamplingSettings, greedy: bool, interrupt: _Interrupt | None
    ) -> list[Generation]:
        pad = self.context.pad_token_id
        eos = self.context.eos_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate() expects
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        kwargs = (
            dict(do_sample=False)
            if greedy
            else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        )
        from transformers import StoppingCriteriaList  # here: see _Interrupt

        recorder = None
        if self.records_routing:
            from rlzoo.moe import RoutingRecorder

            recorder = RoutingRecorder(self.model).attach()
        try:
            result = self.model.generate(
                input_ids=input_ids.to(self.context.device),
                attention_mask=attention.to(self.context.device),
                max_new_tokens=sampling.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=True,  # raw logits, before temperature / top-p: log-probs at temperature 1
                stopping_criteria=StoppingCriteriaList([interrupt] if interrupt is not None else []),
                **kwargs,
            )
        finally:
            if recorder is not None:
                recorder.detach()
        new_tokens = result.sequences[:, width:]
        logits = torch.stack(result.logits, dim=1).float()  # [B, steps, V]
        logp = torch.log_softmax(logits, dim=-1).gather(2, new_tokens.unsqueeze(-1)).squeeze(-1).cpu()
        new_tokens = new_tokens.cpu()
        routing = self._routing_columns(recorder, len(prompts), width) if recorder is not None else None
        generations = []
        for row, prompt in enumerate(prompts):
            tokens = new_tokens[row].tolist()
            finished = eos in tokens
            length = tokens.index(eos) + 1 if finished else len(tokens)
            generation = Generation(list(prompt), tokens[:length], logp[row, :length].tolist(), finished)
            if routing is not None:
                # prompt columns without the left padding, then response tokens 0 .. length-2 (decode inputs);
                # the last sampled token was never run through the model
                generation.routing = torch.cat(
                    [routing[row, width - len(prompt) : width], routing[row, width : width + length - 1]]
                ).cpu()
                if generation.routing.shape[0] != len(prompt) + length - 1:
                    raise RuntimeError(
                        f"recorded {routing.shape[1] - width} decode steps, need {length - 1} for this response"
                    )
            generations.append(generation)
        return generations

    @staticmethod
    def _routing_columns(recorder, rows: int, width: int) -> torch.Tensor:
        """``[rows, width + decode steps, layers, top_k]``: every forward of generate() joined along positions."""
        calls = recorder.calls
        if not calls or any(call.batch_size != rows for call in calls):
            raise RuntimeError(
                f"routing capture saw forwards over {[c.shape[:2] for c in calls]} for {rows} rows; "
                "expected a prefill then one forward per decode step"
            )
        routing = torch.cat([call.indices for call in calls], dim=1)
        if routing.shape[1] < width:
            raise RuntimeError(f"routing capture covered {routing.shape[1]} positions, the prompts take {width}")
        return routing

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.wraps_adapters:
            raise RlzooError(
                "this hf engine samples with LoRA adapters (model.lora.sync: auto or adapter): it receives adapters, "
                "not weights"
            )
        load_checkpoint_weights(self.model, named_tensors)

    def sync_adapter(self, adapter: Adapter) -> None:
        if not self.wraps_adapters:
            raise RlzooError(
                "this hf engine was started without adapters (no model.lora, or sync: merged): it receives the merged "
                "weights"
            )
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self._peft, adapter.tensors)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            raise KeyError(
                f"adapter does not fit this engine's adapters: unexpected {result.unexpected_keys[:3]}, "
                f"missing {missing[:3]}"
            )


class _Interrupt:
    """Stops every row of a generate() once ``pending()`` says newer weights are published (checked per token).

    A stopping criterion by duck typing (generate() calls each one), not a ``transformers.StoppingCriteria``
    subclass: every CLI command lists the engines, and importing transformers here would add about a second to
    each, ``config check`` included."""

    def __init__(self, pending: Callable[[], bool]) -> None:
        self.pending = pending
        self.fired = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.fired = self.fired or self.pending()
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)
