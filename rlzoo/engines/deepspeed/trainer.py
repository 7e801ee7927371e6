"""Training with DeepSpeed: ZeRO 0-3, optional DeepSpeed-MoE layers with expert parallelism.

Same semantics as :class:`rlzoo.engines.torch_trainer.TorchTrainingEngine` (the reference): fp32 master weights,
bf16 autocast when ``trainer.dtype`` is ``bfloat16``, torch AdamW (as DeepSpeed's *client* optimizer, so nothing is
compiled) with the trainer's lr / betas / weight decay, gradient clipping by DeepSpeed's ``gradient_clipping``, and
a non-finite loss or gradient norm skips the update (``train/nonfinite_steps = 1``) without writing NaN weights.

Processes. In one process the engine sets up a world of one (:mod:`rlzoo.engines.deepspeed.env`). Under
``torchrun``/``deepspeed`` every rank starts its own engine with its own share of the batch; DeepSpeed averages the
gradients over the ranks, so a loss that is a mean over equally sized per-rank shares gives the gradient of the
global batch. Every method except :meth:`logprobs`-free bookkeeping is a collective: all ranks must call
``train_step``, ``logprobs`` (when MoE layers are expert-parallel), ``named_weights`` (at ZeRO-3 an iterator
gathering one layer per step, which every rank consumes to the end), ``save`` and ``load_state`` in the same order.

DeepSpeed-MoE (``moe: deepspeed``) converts the model's sparse MoE blocks with
:func:`rlzoo.models.deepspeed_moe.convert_to_deepspeed_moe`: DeepSpeed's expert dispatch (all-to-all over
``ep_size`` ranks) with the Hugging Face router's own routing (no noise, no capacity limit, no dropped tokens). It
cannot be combined with ZeRO-3 (DeepSpeed rejects its native MoE there). The layout is decided once, when the engine
is built (:mod:`rlzoo.engines.deepspeed.moe_blocks`): every step that differs between the two asks it.

Checkpoints (:meth:`save`, :meth:`load_state`): see :mod:`rlzoo.engines.deepspeed.checkpoint`; the DeepSpeed config
and client optimizer: :mod:`rlzoo.engines.deepspeed.config`. The router load-balancing term: as in every engine
(:mod:`rlzoo.engines.aux_loss`), from the same routers (:func:`rlzoo.moe.find_routers`) on both MoE paths.

Known limits. ``train/grad_norm`` is the true global norm (ZeRO 0: computed here over all expert shards; ZeRO 1-3:
DeepSpeed's). At ZeRO 0 with ``ep_size`` > 1 DeepSpeed's own clipping uses the mean over ranks of per-rank norms
(each counting only that rank's experts), so when clipping binds the update differs slightly from one process (measured gap in
docs/benchmarks.md); ZeRO 2 clips with the global norm. At ZeRO-3 the
model is loaded under ``deepspeed.zero.Init`` (:func:`partitioned_load`): each parameter is partitioned as it is
created, so no rank holds the whole fp32 model (at ZeRO 0-2 every rank holds it, as DeepSpeed requires). With
``ep_size`` 1 the DeepSpeed-MoE blocks compute their experts exactly as transformers does (bit-exact); with
``ep_size`` > 1 (DeepSpeed's all-to-all dispatch) in bf16 the expert outputs are combined in fp32 where transformers
does it in bf16, so the two agree only to bf16 precision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from rlzoo.engines.aux_loss import AuxLoss, AuxLossParams
from rlzoo.engines.base import EngineContext, TokenBatch
from rlzoo.engines.deepspeed.checkpoint import Placement, hf_model, load_checkpoint, save_checkpoint
from rlzoo.engines.deepspeed.config import client_optimizer, deepspeed_config
from rlzoo.engines.deepspeed.env import init_deepspeed_distributed
from rlzoo.engines.deepspeed.moe_blocks import ModelMoe, moe_blocks
from rlzoo.engines.gradients import GradientRequest
from rlzoo.engines.module_engine import NONFINITE, ModuleTrainingEngine
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import TrainingLayout


class DeepSpeedTrainingEngine(ModuleTrainingEngine):
    """DeepSpeed ZeRO 0-3 (torch AdamW as client optimizer), optionally with DeepSpeed-MoE expert parallelism."""

    name = "deepspeed"
    requires = ("deepspeed",)
    install_hint = "pip install deepspeed"
    data_parallel = True
    collective_weights = True  # ZeRO-3 gathers partitioned weights, expert parallelism gathers experts

    class Params(AuxLossParams):
        # the combinations DeepSpeed refuses are rejected here, at config validation, naming the field
        moe: Literal["none", "deepspeed"] = Field(
            "none", description="'deepspeed': convert the MoE blocks to DeepSpeed-MoE layers (ZeRO 0-2)"
        )
        zero_stage: int = Field(0, ge=0, le=3, description="ZeRO stage 0-3")
        ep_size: int = Field(1, ge=1, description="expert-parallel ranks per group (moe: deepspeed); divides world")
        backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: gloo on CPU, nccl on CUDA")

        @field_validator("zero_stage")
        @classmethod
        def _zero_stage_fits_moe(cls, stage: int, info: ValidationInfo) -> int:
            if problem := moe_blocks(info.data.get("moe", ModelMoe.name)).zero_stage_problem(stage):
                raise ValueError(problem)
            return stage

        @field_validator("ep_size")
        @classmethod
        def _ep_size_needs_moe(cls, ep_size: int, info: ValidationInfo) -> int:
            if problem := moe_blocks(info.data.get("moe", ModelMoe.name)).ep_size_problem(ep_size):
                raise ValueError(problem)
            return ep_size

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self.moe_blocks: ModelMoe = moe_blocks(self.params.moe)  # the MoE layout, decided here once

    # -- the start-up check and the run's set-up (before start) --------------------------------------------------

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """DeepSpeed-MoE needs an MoE model; ``ep_size`` divides the processes; ZeRO-3 partitions the weights, which
        ``rollout.overlap: 1`` exchanges whole. (The combinations DeepSpeed refuses whatever the run, ZeRO-3 with
        DeepSpeed-MoE and ``ep_size`` without it, are rejected by ``Params`` at config validation.)"""
        p = self.params
        problems = self.moe_blocks.model_problems(run, at)
        if run.world % p.ep_size:
            divisors = [d for d in range(1, run.world + 1) if run.world % d == 0]
            problems.append(
                (
                    f"{at}.ep_size",
                    f"{p.ep_size} does not divide the {run.world} process(es) the run is started with; use one of "
                    f"{divisors} (or start more processes; rlzoo config check --processes N checks for N)",
                )
            )
        if run.config.model.lora is not None and p.zero_stage == 3:
            problems.append(
                (
                    f"{at}.zero_stage",
                    "3 under model.lora is not supported: ZeRO-3 releases the frozen output layer before backward "
                    "recomputes the chunked log-probs (rlzoo.engines.tokens.hidden_logprobs); use 0, 1 or 2 (LoRA's base "
                    "has no gradients or optimizer state to partition), or full fine-tuning (model.lora: null)",
                )
            )
        if run.config.model.lora is not None:
            problems += self.moe_blocks.lora_problems(run, at, p.zero_stage)
        if run.config.rollout.overlap and p.zero_stage == 3:
            problems.append(
                (
                    "rollout.overlap",
                    "1 swaps the sampling weights into the training engine's parameters for the old-log-prob pass, which "
                    f"ZeRO-3 partitions: use {at}.zero_stage 0, 1 or 2, or rollout.overlap: 0",
                )
            )
        return problems

    def adapter_targets_supported(self, fused_parameters: list[str]) -> str | None:
        return self.moe_blocks.adapter_targets_problem(fused_parameters)

    def process_group_backend(self) -> str:
        return self.params.backend

    def gradients_unavailable(self) -> str | None:
        if self.params.zero_stage == 3:  # autograd would see the empty placeholders of the partitioned parameters
            return f"training engine {self.name!r} at ZeRO-3 partitions the weights; zero_stage 0-2 computes them"
        return None

    def memory_layout(self) -> TrainingLayout:
        return self.moe_blocks.memory_layout(self.params.zero_stage, self.params.ep_size)

    def memory_hint(self, run: RunFacts) -> str:
        return self.moe_blocks.memory_hint(self.params.zero_stage, self.params.ep_size)

    # -- start -----------------------------------------------------------------------------------------------

    def start(self, context: EngineContext, trainer_config: Any) -> None:
        try:
            import deepspeed  # noqa: F401
        except ImportError as err:
            raise ImportError(f"the deepspeed training engine needs DeepSpeed (pip install deepspeed): {err}") from err
        import torch.distributed as dist

        p = self.params
        self.context = context
        self.config = trainer_config
        self.backend = init_deepspeed_distributed(p.backend)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if self.world_size % p.ep_size:
            raise ValueError(f"ep_size={p.ep_size} must divide the world size {self.world_size}")
        self.placement = Placement(p.zero_stage, self.moe_blocks, p.ep_size, self.world_size, self.rank)

        ds_config = deepspeed_config(trainer_config, p.zero_stage)
        with partitioned_load(ds_config) if p.zero_stage == 3 else nullcontext():
            model = self._load_module()  # fp32 master weights
        model.train()
        self._prepare_model(model)
        self.moe_blocks.convert(model, p.ep_size, context.model_dir, self.lora)
        # the HF router stays the block's `mlp.gate` after conversion: one finder serves both MoE paths
        self._aux_loss = AuxLoss(model, p.aux_loss_coef)
        optimizer = client_optimizer(model, trainer_config, expert_groups=self.moe_blocks.expert_groups)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self._check_expert_groups()

    def _check_expert_groups(self) -> None:
        if self.params.ep_size == 1:
            return
        import torch.distributed as dist

        from rlzoo.models.deepspeed_moe import deepspeed_moe_blocks

        for block in deepspeed_moe_blocks(self.engine.module):
            group = block.moe.deepspeed_moe.ep_group
            if dist.get_rank(group=group) != block.ep_rank:
                raise RuntimeError(
                    f"expert-parallel layout mismatch: rank {self.rank} holds experts of group rank {block.ep_rank}"
                    f" but DeepSpeed placed it at {dist.get_rank(group=group)}"
                )

    @property
    def model(self) -> torch.nn.Module:
        """The unwrapped model (DeepSpeed-MoE blocks in place of the HF ones under ``moe: deepspeed``)."""
        return self.engine.module

    def _module(self) -> torch.nn.Module:
        return self.model if self._bare else self.engine

    _bare = False  # forwards through the model itself, not DeepSpeed's engine (gradients without a step)

    def gradients(self, batch: TokenBatch, request: GradientRequest) -> list[torch.Tensor]:
        """As every in-process engine computes them, through the bare model: DeepSpeed's engine hooks the outputs of
        its forward so that a backward of them reduces the gradients into its ZeRO partitions (engine.backward's
        prologue and epilogue), which a gradient without a step must not do."""
        self._bare = True
        try:
            return super().gradients(batch, request)
        finally:
            self._bare = False

    def _all_ranks_true(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1.0 if flag else 0.0], device=self._device())
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item() > 0)

    def _forward_count(self, count: int) -> int:
        """The most micro-batches any rank needs: ZeRO-3 gathers parameters and expert parallelism exchanges
        tokens in every forward, and ZeRO reduces gradients in every backward, so every rank runs as many."""
        if self.world_size == 1:
            return count
        import torch.distributed as dist

        value = torch.tensor([float(count)], device=self._device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        # DeepSpeed's own accumulation: gradients are reduced, and the step applies, at the boundary only
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def _optimizer_step(self) -> dict[str, float]:
        if self.params.zero_stage == 0:
            grad_norm = self._global_grad_norm()
            if not math.isfinite(grad_norm):
                self.engine.optimizer.zero_grad(set_to_none=True)
                return {NONFINITE: 1.0, "train/grad_norm": float("nan")}
            self.engine.step()
        else:
            self.engine.step()  # ZeRO checks the reduced gradients and skips a non-finite step itself
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else float("nan")
            if not self.engine.was_step_applied() or not math.isfinite(grad_norm):
                return {NONFINITE: 1.0, "train/grad_norm": float("nan")}
        return {NONFINITE: 0.0, "train/grad_norm": grad_norm}

    def _global_grad_norm(self) -> float:
        """L2 norm of the (already averaged) gradients at ZeRO 0, expert shards of every EP rank included."""
        from deepspeed.moe.utils import is_moe_param

        dense = torch.zeros((), dtype=torch.float64)
        expert = torch.zeros((), dtype=torch.float64)
        for param in self.engine.module.parameters():
            if param.grad is None:
                continue
            sq = param.grad.detach().double().pow(2).sum().cpu()
            if is_moe_param(param):
                expert += sq
            else:
                dense += sq
        if self.params.ep_size > 1:
            import torch.distributed as dist

            from rlzoo.models.deepspeed_moe import deepspeed_moe_blocks

            group = deepspeed_moe_blocks(self.engine.module)[0].moe.deepspeed_moe.ep_group
            expert = expert.to(self._device())
            dist.all_reduce(expert, group=group)
            expert = expert.cpu()
        total = dense + expert
        bad = not bool(torch.isfinite(total))
        if not self._all_ranks_true(not bad):
            return float("nan")
        return float(total.sqrt())

    # -- weights ---------------------------------------------------------------------------------------------

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint-format weights. A collective under ZeRO-3 and expert parallelism (all ranks call it).

        ZeRO-3 (full fine-tuning): a lazy iterator that gathers one decoder layer at a time
        (:func:`rlzoo.engines.deepspeed.layerwise.layerwise_weights`); every rank must consume it to the end, in
        lockstep. LoRA's merged weights at ZeRO-3 (refused by :meth:`preflight`) and DeepSpeed-MoE's swapped-back
        experts (ZeRO 0-2, all blocks swapped at once) keep the whole-model view, as copies."""
        from rlzoo.engines.deepspeed.layerwise import layerwise_weights
        from rlzoo.engines.lora import merged_weights
        from rlzoo.models.export import checkpoint_weights

        weights = merged_weights if self.lora else checkpoint_weights
        if self.params.zero_stage < 3 and self.moe_blocks.in_checkpoint_layout:
            return weights(self.engine.module)  # views of the live (full) parameters, as the torch engine
        if self.params.zero_stage == 3 and not self.lora:
            return layerwise_weights(self.engine.module)  # at most one layer gathered at a time
        with hf_model(self.engine, self.placement) as model:
            # copies: gathered ZeRO-3 parameters are released and swapped-in expert tensors dropped on exit
            return [(name, tensor.clone()) for name, tensor in weights(model)]

    @contextmanager
    def _whole_model(self) -> Iterator[torch.nn.Module]:
        with hf_model(self.engine, self.placement) as model:
            yield model

    def save(self, directory: Path) -> None:
        """``directory/model`` (HF folder), ``deepspeed.json`` and per-rank optimizer state. Collective."""
        save_checkpoint(self.engine, self.placement, directory)

    def load_state(self, directory: Path) -> None:
        """Restore weights (master copies included) and optimizer state written by :meth:`save`. Collective."""
        load_checkpoint(self.engine, self.placement, directory, self.lora)


@contextmanager
def partitioned_load(ds_config: dict[str, Any]) -> Iterator[None]:
    """Models loaded inside are built under ``deepspeed.zero.Init``: every parameter is partitioned over the ranks
    as it is created and the checkpoint's tensors are scattered into the partitions (transformers'
    ``HfDeepSpeedConfig``, the same path as its Trainer at ZeRO-3). Scoped to the load: a rollout engine or
    reference model built later in this process loads whole."""
    from transformers.integrations import HfDeepSpeedConfig

    handle = HfDeepSpeedConfig(ds_config)  # transformers holds only a weak reference: keep it alive while loading
    try:
        yield
    finally:
        del handle
