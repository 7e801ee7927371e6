"""What the in-process training engines share: every pass in micro-batches under a token budget, and one optimizer
step per minibatch with the gradients of its micro-batches accumulated.

Passes without gradient (old / reference log-probs, entropies) run micro-batch by micro-batch
(:func:`rlzoo.engines.micro_batches.plan_micro_batches`), each result scattered back to the batch's ``[rows, T]``
layout. One optimizer step on a minibatch (:meth:`ModuleTrainingEngine.train_step`)::

    one micro-batch:  forward -> loss_fn(logp [, H]) (+ aux) -> backward                         (as one pass)
    several:          1. each micro-batch without gradient: logp, H of the whole minibatch; aux terms summed
                      2. loss, metrics = loss_fn(logp, H) on those as leaves; g = dloss/dlogp, dloss/dH
                      3. each micro-batch again, with gradient: backward of
                             sum(logp * g_logp) + sum(H * g_H) + aux_loss_coef * its share of the aux loss
                         the gradients accumulate (DeepSpeed: its accumulation boundary is the last one)
    clip, optimizer step

Step 3's gradient is the chain rule through the minibatch's loss, so the loss and gradient equal one pass over the
minibatch for every loss: the normalisers of every aggregation, sequence ratios, batch-level clippers (KL-Cov's and
Clip-Cov's top-k selections, GMPO) and regularisers all see the whole minibatch, whatever the component (a third
party's included); the MoE aux loss is linear in each token's router probabilities once the whole minibatch's
top-k counts are known (:class:`rlzoo.moe.balance.BalanceTerms`). The price is one extra forward without gradient
per minibatch, paid only when it needs more than one micro-batch.

Each forward runs the model with ``output_hidden_states`` and ``logits_to_keep=1`` and takes the response
positions' last hidden states through the output layer in chunks (:func:`rlzoo.engines.tokens.hidden_logprobs`):
no ``[rows, length, vocab]`` logits tensor exists. Each forward announces its layout to the MoE hooks
(:func:`rlzoo.moe.hooks.forward_layout`), so Routing Replay records and replays in the batch's own layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from rlzoo.engines.aux_loss import AuxLoss
from rlzoo.engines.base import Adapter, LossFn, RoutingPass, TokenBatch, TrainingEngine
from rlzoo.engines.base_policy import BasePolicy
from rlzoo.engines.device import to_device as _to
from rlzoo.engines.gradients import GradientRequest
from rlzoo.engines.micro_batches import PACKABLE_ATTENTION, MicroBatch, padding_fraction, plan_micro_batches, with_count
from rlzoo.engines.token_stats import provider
from rlzoo.engines.tokens import hidden_logprobs
from rlzoo.errors import RlzooError
from rlzoo.moe import Layout, Routing, find_routers, record_routing, replay_routing, require_routers
from rlzoo.moe.hooks import ForwardLayout, forward_layout
from rlzoo.moe.routers import layout_of
from rlzoo.util.reductions import SkippedUpdates

NONFINITE = "train/nonfinite_steps"  # always a SkippedUpdates: the fault policy reads the declaration


class ModuleTrainingEngine(TrainingEngine):
    """A training engine whose policy is an in-process ``nn.Module``; subclasses say how to run, step and sync it.

    A subclass sets ``config`` (the trainer config), ``_aux_loss`` and calls :meth:`_prepare_model` in ``start``,
    and implements :attr:`model`, :meth:`_module`, :meth:`_backward` and :meth:`_optimizer_step`. This class
    implements what the core asks of the policy (:class:`TrainingEngine`): its MoE layout, recording and replaying
    its routing (hooks on the module's routers, :mod:`rlzoo.moe`), and copying / exchanging its weights for
    ``rollout.overlap: 1`` (in place, on the module's parameters: the full weights, so not under ZeRO-3)."""

    computes_token_stats = True  # a no-grad pass through the output layer in chunks, per statistic
    computes_gradients = True  # autograd over the same micro-batched passes as a step, without the step

    trains_values = True
    trains_adapters = True

    config: Any
    context: Any  # the EngineContext the engine was started with
    _aux_loss: AuxLoss
    _packing: bool = False
    _routers: list | None = None  # the policy's MoE routers, found once (the module's layers do not change)
    _gates: dict[int, str] | None = None  # each router's gate function, detected on its first replayed call

    # -- what a subclass provides ---------------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The policy as an in-process transformers model (its parameters are the weights this engine trains)."""
        raise NotImplementedError

    def _module(self) -> torch.nn.Module:
        """The callable that runs the model's forward (the model itself, or a wrapper such as DeepSpeed's)."""
        raise NotImplementedError

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch's loss; ``last``: the minibatch's last micro-batch (the step follows)."""
        raise NotImplementedError

    def _optimizer_step(self) -> dict[str, float]:
        """Clip and step with the accumulated gradients: ``{train/nonfinite_steps, train/grad_norm}``."""
        raise NotImplementedError

    def _zero_grad(self) -> None:
        """Before a minibatch's first backward (engines that clear gradients in their step need nothing)."""

    def _forward_count(self, count: int) -> int:
        """The number of forwards every process runs for a pass of which this process needs ``count``."""
        return count

    def _all_ranks_true(self, flag: bool) -> bool:
        return flag

    # -- the policy: MoE routing and weight copies (TrainingEngine's contract) -------------------------------------

    def moe_layout(self) -> Layout | None:
        if self._routers is None:
            self._routers = require_routers(self.model) if find_routers(self.model) else []
            self._gates = {}
        return layout_of(self._routers) if self._routers else None

    @contextmanager
    def routing_pass(self, replay: Routing | None = None) -> Iterator[RoutingPass]:
        if self.moe_layout() is None:
            raise RlzooError(f"{type(self.model).__name__} has no mixture-of-experts router to record or replay")
        result = RoutingPass()
        with ExitStack() as stack:
            replaying = None
            if replay is not None:
                replaying = stack.enter_context(replay_routing(self.model, replay, self._routers, self._gates))
            used = stack.enter_context(record_routing(self.model, self._routers))
            yield result
        result.routing = used
        result.fresh = replaying.fresh if replaying is not None else used

    def _trained(self) -> list[torch.Tensor]:
        """The parameters an optimizer step changes (the adapters only, under LoRA): what a weight copy holds."""
        return [param for param in self.model.parameters() if param.requires_grad]

    @torch.no_grad()
    def weights_finite(self) -> bool:
        """Every trained parameter finite, checked where it lives: under ZeRO-3 this rank's partition
        (``ds_tensor``; the parameter itself is empty between passes), under expert parallelism this rank's experts;
        combined over the ranks (a collective with several processes)."""
        finite = True
        for param in self._trained():
            local = getattr(param, "ds_tensor", None)
            tensor = param if local is None else local
            if tensor.numel() and not bool(torch.isfinite(tensor).all()):
                finite = False
                break
        return self._all_ranks_true(finite)

    @torch.no_grad()
    def copy_weights(self, into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if into is None:
            return [param.detach().clone() for param in self._trained()]
        for saved, param in zip(into, self._trained(), strict=True):
            saved.copy_(param)
        return into

    @torch.no_grad()
    def exchange_weights(self, copy: list[torch.Tensor]) -> None:
        for param, saved in zip(self._trained(), copy, strict=True):
            current = param.detach().clone()
            param.copy_(saved)
            saved.copy_(current)

    @torch.no_grad()
    def restore_weights(self, copy: list[torch.Tensor]) -> None:
        for param, saved in zip(self._trained(), copy, strict=True):
            param.copy_(saved)

    # -- LoRA (context.lora): the adapters, the merged weights, the base policy ------------------------------------

    @property
    def lora(self) -> bool:
        return self.context.lora is not None and self.context.head == "lm"

    def adapter(self, version: int = 0) -> Adapter:
        if not self.lora:
            raise RlzooError(f"training engine {self.name!r} trains every weight (model.lora is null): no adapters")
        from rlzoo.engines.lora import adapter

        with self._whole_model() as model:
            return adapter(model, version)

    def without_adapters(self) -> BasePolicy:
        if not self.lora:
            raise RlzooError(f"training engine {self.name!r} trains every weight (model.lora is null): no base policy")
        return BasePolicy(self)

    @contextmanager
    def _whole_model(self) -> Iterator[torch.nn.Module]:
        """The model with every parameter present (engines that partition it gather it here; a collective then)."""
        yield self.model

    # -- set-up ---------------------------------------------------------------------------------------------------

    def _load_module(self) -> torch.nn.Module:
        """The model to train in fp32 master weights: the policy (``context.head == "lm"``), with fresh LoRA adapters
        when ``context.lora`` is set, or a critic."""
        from rlzoo.engines.lora import wrap
        from rlzoo.models import load_model, load_value_model

        if self.context.head == "value":
            return load_value_model(self.context.model_dir, "float32", seed=self.context.seed)
        model = load_model(self.context.model_dir, "float32")[0]
        if self.context.lora is None:
            return model
        return wrap(model, self.context.lora, self.context.seed, base=Path(self.context.model_dir).resolve())

    def _prepare_model(self, model: torch.nn.Module) -> None:
        """Activation checkpointing as configured; packing where the model's attention honours packed positions."""
        if self.config.activation_checkpointing:
            if not getattr(model, "supports_gradient_checkpointing", False):
                raise RlzooError(
                    f"trainer.activation_checkpointing: {type(model).__name__} does not support gradient "
                    "checkpointing; set it to false"
                )
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        attention = getattr(model.config, "_attn_implementation", None)
        self._packing = bool(self.config.packing) and attention in PACKABLE_ATTENTION

    def _autocast(self):
        if self.config.dtype == "bfloat16":
            return torch.autocast(self._device().type, dtype=torch.bfloat16)
        return nullcontext()

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- passes ---------------------------------------------------------------------------------------------------

    def _plan(self, batch: TokenBatch) -> list[MicroBatch]:
        plan = plan_micro_batches(batch, self.config.max_tokens_per_micro_batch, self._packing)
        return with_count(plan, self._forward_count(len(plan)), self.context.pad_token_id)

    def _forward(
        self, batch: TokenBatch, mb: MicroBatch, entropy: bool, statistic: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[N]`` log-probs (and entropies) of one micro-batch's response tokens, left on the model's device (the loss
        is computed there); for a critic, their values; with ``statistic``, that token statistic
        (:mod:`rlzoo.interfaces.token_stats`) at their positions instead."""
        device = self._device()
        layout = ForwardLayout(mb.source_row, mb.source_pos, *batch.input_ids.shape)
        value_head = self.context.head == "value"
        # a policy's logits come from its hidden states below, chunk by chunk; a critic has one scalar per position
        outputs = {} if value_head else {"output_hidden_states": True, "logits_to_keep": 1}
        with forward_layout(layout):
            out = self._module()(
                input_ids=_to(mb.input_ids, device),
                attention_mask=None if mb.attention_mask is None else _to(mb.attention_mask, device),
                position_ids=_to(mb.position_ids, device),
                use_cache=False,
                **outputs,
            )
        if value_head:
            return out.logits[..., 0].reshape(-1)[_to(mb.predict, device)].float(), None
        hidden = out.hidden_states[-1]  # [b, w, H], after the final norm
        picked = hidden.reshape(-1, hidden.shape[-1])[_to(mb.predict, device)]  # [N, H]
        head = self.model.get_output_embeddings()
        if statistic is not None:
            return provider(statistic)(picked, head, _to(mb.target, device), self.config.logits_chunk_tokens), None
        return hidden_logprobs(picked, head, _to(mb.target, device), entropy, self.config.logits_chunk_tokens)

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return self._no_grad_pass(batch, entropy=False)[0]

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        if self.context.head != "value":
            raise RlzooError(f"training engine {self.name!r} was started for a policy, not a critic (head 'lm')")
        return self._no_grad_pass(batch, entropy=False)[0]

    @torch.no_grad()
    def logprobs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self._no_grad_pass(batch, entropy=True)

    @torch.no_grad()
    def token_stats(self, batch: TokenBatch, names: Sequence[str]) -> dict[str, torch.Tensor]:
        return {name: self._no_grad_pass(batch, entropy=False, statistic=name)[0] for name in names}

    def _no_grad_pass(
        self, batch: TokenBatch, entropy: bool, statistic: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self._device()
        logp = torch.zeros(batch.response_mask.shape, dtype=torch.float64, device=device)
        ent = torch.zeros_like(logp) if entropy else None
        for mb in self._plan(batch):
            with self._autocast():
                mb_logp, mb_ent = self._forward(batch, mb, entropy, statistic)
            if mb.dummy:
                continue
            at = (_to(mb.out_row, device), _to(mb.out_col, device))
            logp[at] = mb_logp.double()
            if ent is not None:
                ent[at] = mb_ent.double()
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)  # the step's tensors: CPU
        return logp.to(dtype).cpu(), (ent.to(dtype).cpu() if ent is not None else None)

    # -- the optimizer step ---------------------------------------------------------------------------------------

    def train_step(self, batch: TokenBatch, loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        self._zero_grad()
        metrics = self.accumulate_gradients(batch, loss_fn, with_entropy)
        if metrics.get(NONFINITE):
            return metrics
        metrics = {**metrics, **self._optimizer_step()}
        return {**metrics, NONFINITE: SkippedUpdates(metrics[NONFINITE])}

    def accumulate_gradients(self, batch: TokenBatch, loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        """Forward and backward of ``batch`` in micro-batches (module docstring); the step is not taken. A
        non-finite loss on any rank runs no backward and reports ``train/nonfinite_steps = 1``."""
        plan = self._plan(batch)
        shape = {"train/padding_fraction": padding_fraction(plan), "train/micro_batches": float(len(plan))}
        if len(plan) == 1:
            return {**shape, **self._one_pass(batch, plan[0], loss_fn, with_entropy)}
        return {**shape, **self._accumulated(batch, plan, loss_fn, with_entropy)}

    def _one_pass(self, batch: TokenBatch, mb: MicroBatch, loss_fn: LossFn, with_entropy: bool) -> dict[str, float]:
        with self._autocast(), self._aux_loss.forward():
            logp, ent = self._forward(batch, mb, with_entropy)
        outputs = loss_fn(*self._scatter(batch, mb, logp, ent))
        loss, metrics = self._aux_loss.add(*outputs, mb.token_mask)
        if mb.dummy:  # this rank had no rows: a zero-weighted forward keeps its collectives in step
            loss = loss + 0.0 * logp.sum()
        if not self._all_ranks_true(bool(torch.isfinite(loss))):
            return {**metrics, NONFINITE: SkippedUpdates(1.0)}
        self._backward(loss, last=True)
        return {**metrics, NONFINITE: SkippedUpdates(0.0)}

    def _accumulated(
        self, batch: TokenBatch, plan: list[MicroBatch], loss_fn: LossFn, with_entropy: bool
    ) -> dict[str, float]:
        whole, device = None, self._device()
        with torch.no_grad():  # 1. the whole minibatch's log-probs and aux terms
            logp = torch.zeros(batch.response_mask.shape, dtype=torch.float64, device=device)
            ent = torch.zeros_like(logp)
            for mb in plan:
                with self._autocast(), self._aux_loss.forward():
                    mb_logp, mb_ent = self._forward(batch, mb, with_entropy)
                terms = self._aux_loss.terms(mb.token_mask)
                if mb.dummy:
                    continue
                whole = terms if whole is None else whole + terms
                at = (_to(mb.out_row, device), _to(mb.out_col, device))
                logp[at] = mb_logp.double()
                if with_entropy:
                    ent[at] = mb_ent.double()
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        leaves = [logp.to(dtype).requires_grad_()] + ([ent.to(dtype).requires_grad_()] if with_entropy else [])
        outputs = loss_fn(*leaves)  # 2. the minibatch's loss, and its gradient at the log-probs
        loss, metrics = self._aux_loss.add_whole(*outputs, whole)
        if not self._all_ranks_true(bool(torch.isfinite(loss))):
            return {**metrics, NONFINITE: SkippedUpdates(1.0)}
        grads = torch.autograd.grad(outputs[0], leaves, allow_unused=True)
        grads = [torch.zeros_like(leaf) if g is None else g.detach() for g, leaf in zip(grads, leaves, strict=True)]
        for index, mb in enumerate(plan):  # 3. backward micro-batch by micro-batch
            with self._autocast(), self._aux_loss.forward():
                mb_logp, mb_ent = self._forward(batch, mb, with_entropy)
            surrogate = self._aux_loss.share(self._aux_loss.terms(mb.token_mask), whole)
            if mb.dummy:
                surrogate = 0.0 * mb_logp.sum()
            else:
                at = (_to(mb.out_row, device), _to(mb.out_col, device))
                surrogate = surrogate + (mb_logp * grads[0][at].to(mb_logp.dtype)).sum()
                if with_entropy:
                    surrogate = surrogate + (mb_ent * grads[1][at].to(mb_ent.dtype)).sum()
            self._backward(surrogate, last=index == len(plan) - 1)
        return {**metrics, NONFINITE: SkippedUpdates(0.0)}

    def gradients(self, batch: TokenBatch, request: GradientRequest) -> list[torch.Tensor]:
        """Steps 1-3 of :meth:`train_step` (module docstring) for every loss at once, and no step: one pass without
        gradient, each loss's gradient at its log-probs, then per micro-batch one forward with gradient and one
        ``torch.autograd.grad`` per loss (``.grad`` and the optimizer untouched), each projected as it comes."""
        params, device = self._trained(), self._device()
        passed = self.logprobs_and_entropy(batch) if request.with_entropy else (self.logprobs(batch),)
        leaves = [t.to(device).requires_grad_() for t in passed]
        seeds = [  # per loss: d loss / d logp (and d loss / d H), [rows, T]
            torch.autograd.grad(loss_fn(*leaves)[0], leaves, allow_unused=True, materialize_grads=True)
            for loss_fn in request.loss_fns
        ]
        totals: list[torch.Tensor] = []
        for mb in (mb for mb in self._plan(batch) if not mb.dummy):
            with self._autocast():
                outputs = [t for t in self._forward(batch, mb, request.with_entropy) if t is not None]
            at, part = (_to(mb.out_row, device), _to(mb.out_col, device)), []
            for index, seed in enumerate(seeds):  # the chain rule through each loss: sum_t logp_t * dloss/dlogp_t
                surrogate = sum((o * g[at].to(o.dtype)).sum() for o, g in zip(outputs, seed, strict=True))
                grads = torch.autograd.grad(surrogate, params, retain_graph=index < len(seeds) - 1, allow_unused=True)
                part.append(request.project(grads))
            totals = [a + b for a, b in zip(totals, part, strict=True)] if totals else part
        return totals

    def _scatter(
        self, batch: TokenBatch, mb: MicroBatch, logp: torch.Tensor, ent: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """One micro-batch's ``[N]`` results in the batch's ``[rows, T]`` layout, differentiably (0 elsewhere)."""
        out = []
        for values in (logp, ent) if ent is not None else (logp,):
            full = values.new_zeros(batch.response_mask.shape)
            if not mb.dummy:
                full = full.index_put((_to(mb.out_row, values.device), _to(mb.out_col, values.device)), values)
            out.append(full)
        return out
