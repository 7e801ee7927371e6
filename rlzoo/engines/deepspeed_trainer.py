"""Training with DeepSpeed: ZeRO 0-3, optional DeepSpeed-MoE layers with expert parallelism.

Same semantics as :class:`rlzoo.engines.torch_trainer.TorchTrainingEngine` (the reference): fp32 master weights,
bf16 autocast when ``trainer.dtype`` is ``bfloat16``, torch AdamW (as DeepSpeed's *client* optimizer, so nothing is
compiled) with the trainer's lr / betas / weight decay, gradient clipping by DeepSpeed's ``gradient_clipping``, and
a non-finite loss or gradient norm skips the update (``train/nonfinite_steps = 1``) without writing NaN weights.

Processes. In one process the engine sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` when
they are absent (a free port), and DeepSpeed then runs with a world of one (gloo on CPU, nccl on CUDA). Under
``torchrun``/``deepspeed`` every rank starts its own engine with its own share of the batch; DeepSpeed averages the
gradients over the ranks, so a loss that is a mean over equally sized per-rank shares gives the gradient of the
global batch. Every method except :meth:`logprobs`-free bookkeeping is a collective: all ranks must call
``train_step``, ``logprobs`` (when MoE layers are expert-parallel), ``named_weights``, ``save`` and ``load_state``
in the same order.

DeepSpeed-MoE (``moe: deepspeed``) converts the model's sparse MoE blocks with
:func:`rlzoo.models.deepspeed_moe.convert_to_deepspeed_moe`: DeepSpeed's expert dispatch (all-to-all over
``ep_size`` ranks) with the Hugging Face router's own routing (no noise, no capacity limit, no dropped tokens). It
cannot be combined with ZeRO-3 (DeepSpeed rejects its native MoE there).

Checkpoints (:meth:`save`): ``dir/model`` is a Hugging Face folder (safetensors, experts in the checkpoint layout,
parameters gathered under ZeRO-3); ``dir/deepspeed.json`` records the layout; ``dir/optimizer/rank{r:05d}/`` holds
each rank's optimizer state in :func:`rlzoo.checkpoint.save_optimizer`'s pickle-free format: at ZeRO 0 the AdamW
state of the rank's parameters, at ZeRO 1-3 the AdamW state of the rank's flat fp32 partitions. The fp32 master
weights are not stored separately: the model parameters are fp32 and equal to them after every step, and
:meth:`load_state` rebuilds the master partitions from the loaded weights. Resuming is exact with the same ZeRO
stage, ``moe``, ``ep_size`` and world size (checked); other combinations are refused with an error.

Known limits. ``train/grad_norm`` is the true global norm (ZeRO 0: computed here over all expert shards; ZeRO 1-3:
DeepSpeed's). At ZeRO 0 with ``ep_size`` > 1 DeepSpeed's own clipping uses the mean over ranks of per-rank norms
(each counting only that rank's experts), so when clipping binds the update differs slightly from one process (a
2e-6 relative grad-norm gap after 3 steps on the tiny test model); ZeRO 2 clips with the global norm. The model is
loaded whole on every rank before ZeRO-3 partitions it (no ``zero.Init``), which is fine for small models only. In
bf16 the DeepSpeed-MoE path combines the expert outputs in fp32 where transformers does it in bf16, so the two agree
only to bf16 precision.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from rlzoo.checkpoint import load_optimizer, save_optimizer
from rlzoo.engines.base import EngineContext, LossFn, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import response_logprobs
from rlzoo.interfaces.base import Params as ComponentParams

CHECKPOINT_FORMAT = "rlzoo-deepspeed-1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ENV_SET_HERE: list[str] = []


def ensure_distributed_env() -> None:
    """Fill in the torch.distributed environment of a single process where a launcher has not set it."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_PORT" not in os.environ:
        raise RuntimeError("WORLD_SIZE > 1 but MASTER_PORT is not set: start the ranks with torchrun or deepspeed")
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        if key not in os.environ:
            os.environ[key] = value
            _ENV_SET_HERE.append(key)
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = os.environ["RANK"]
        _ENV_SET_HERE.append("LOCAL_RANK")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
        _ENV_SET_HERE.append("MASTER_PORT")


def shutdown_distributed() -> None:
    """Destroy the process group DeepSpeed runs on and unset the variables :func:`ensure_distributed_env` set.

    For tests and notebooks that go on without DeepSpeed in the same process; every engine started before is
    unusable afterwards. A later :meth:`DeepSpeedTrainingEngine.start` initialises a fresh group.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()
    while _ENV_SET_HERE:
        os.environ.pop(_ENV_SET_HERE.pop(), None)


def init_deepspeed_distributed(backend: str = "auto") -> str:
    """Initialise DeepSpeed's communication backend once per process; returns the backend used.

    On CPU DeepSpeed's ``TorchBackend`` would JIT-compile its shared-memory ``shm_comm`` op (minutes on a small
    machine) the first time. That op only serves ``inference_all_reduce`` (AutoTP inference), never training, so it
    is marked incompatible in DeepSpeed's op table (``deepspeed.ops.__compatible_ops__``, a cached dict meant to
    be edited) and communication falls back to plain torch.distributed (gloo). Set ``RLZOO_DS_SHM_COMM=1`` to keep
    it.
    """
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    ensure_distributed_env()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if get_accelerator().device_name() == "cpu" and os.environ.get("RLZOO_DS_SHM_COMM", "0") != "1":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    else:  # already initialised (an earlier engine, or the caller): DeepSpeed wraps the existing process group
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False)
    return dist.get_backend()


class DeepSpeedTrainingEngine(TrainingEngine):
    """DeepSpeed ZeRO 0-3 (torch AdamW as client optimizer), optionally with DeepSpeed-MoE expert parallelism."""

    name = "deepspeed"
    data_parallel = True
    collective_weights = True  # ZeRO-3 gathers partitioned weights, expert parallelism gathers experts

    class Params(ComponentParams):
        zero_stage: int = Field(0, ge=0, le=3, description="ZeRO stage 0-3")
        moe: Literal["none", "deepspeed"] = Field(
            "none", description="'deepspeed': convert the MoE blocks to DeepSpeed-MoE layers (ZeRO 0-2)"
        )
        ep_size: int = Field(1, ge=1, description="expert-parallel ranks per group (moe: deepspeed); divides world")
        aux_loss_coef: float = Field(
            0.0, ge=0.0, description="router load-balancing loss coefficient added to the loss when > 0"
        )
        backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: gloo on CPU, nccl on CUDA")

    # -- start -----------------------------------------------------------------------------------------------

    def start(self, context: EngineContext, trainer_config: Any) -> None:
        try:
            import deepspeed  # noqa: F401
        except ImportError as err:
            raise ImportError(f"the deepspeed training engine needs DeepSpeed (pip install deepspeed): {err}") from err
        import torch.distributed as dist

        from rlzoo.models import load_model

        p = self.params
        if p.moe == "deepspeed" and p.zero_stage == 3:
            raise ValueError("trainer.engine.moe=deepspeed cannot run at ZeRO-3 (DeepSpeed rejects native MoE there);"
                             " use zero_stage 0-2, or moe=none at ZeRO-3")
        if p.ep_size > 1 and p.moe != "deepspeed":
            raise ValueError("trainer.engine.ep_size > 1 needs moe=deepspeed")
        self.context = context
        self.config = trainer_config
        self.backend = init_deepspeed_distributed(p.backend)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if self.world_size % p.ep_size:
            raise ValueError(f"ep_size={p.ep_size} must divide the world size {self.world_size}")

        model, _ = load_model(context.model_dir, "float32")  # fp32 master weights, the full model on every rank
        model.train()
        if p.moe == "deepspeed":
            from rlzoo.models.deepspeed_moe import convert_to_deepspeed_moe

            if convert_to_deepspeed_moe(model, p.ep_size) == 0:
                raise ValueError(f"moe=deepspeed: {context.model_dir} has no sparse MoE blocks to convert")
        self._routers = _routers(model)

        params = [q for q in model.parameters() if q.requires_grad]
        groups: list[dict[str, Any]] = [{"params": params, "name": "dense"}]
        if p.moe == "deepspeed":
            from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

            groups = split_params_into_different_moe_groups_for_optimizer(groups[0])
        optimizer = torch.optim.AdamW(
            groups, lr=trainer_config.lr, betas=tuple(trainer_config.betas), weight_decay=trainer_config.weight_decay
        )
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self._ds_config())
        self._check_expert_groups()
        self._collect_router_logits = False
        self._router_logits: list[torch.Tensor] = []
        for router in self._routers:
            router.register_forward_hook(self._router_hook)

    def _ds_config(self) -> dict[str, Any]:
        clip = self.config.grad_clip
        return {
            "train_micro_batch_size_per_gpu": 1,  # the engine is fed whole batches; these only satisfy the config
            "gradient_accumulation_steps": 1,
            "gradient_clipping": float(clip) if clip is not None else 0.0,
            "zero_optimization": {"stage": self.params.zero_stage},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }

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

    def _autocast(self):
        if self.config.dtype == "bfloat16":
            return torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16)
        return nullcontext()

    # -- forward passes ---------------------------------------------------------------------------------------

    def _router_hook(self, module, inputs, output) -> None:
        if self._collect_router_logits:
            self._router_logits.append(output[0])

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        with self._autocast():
            return response_logprobs(self.engine, batch).float().cpu()

    def _all_ranks_true(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1.0 if flag else 0.0], device=self._device())
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item() > 0)

    def _device(self) -> torch.device:
        return next(self.engine.module.parameters()).device

    def train_step(self, batch: TokenBatch, loss_fn: LossFn) -> dict[str, float]:
        self._router_logits = []
        self._collect_router_logits = bool(self._routers)
        try:
            with self._autocast():
                logp = response_logprobs(self.engine, batch).float()
        finally:
            self._collect_router_logits = False
        loss, metrics = loss_fn(logp)
        metrics = dict(metrics)
        if self._router_logits:
            aux = load_balancing_loss(
                self._router_logits, self._routers[0].num_experts, self._routers[0].top_k,
                batch.attention_mask.to(self._device()),
            )
            metrics["train/aux_loss"] = float(aux.detach())
            if self.params.aux_loss_coef > 0:
                loss = loss + self.params.aux_loss_coef * aux
        self._router_logits = []
        if not self._all_ranks_true(bool(torch.isfinite(loss))):
            return {**metrics, "train/nonfinite_steps": 1.0}
        self.engine.backward(loss)
        if self.params.zero_stage == 0:
            grad_norm = self._global_grad_norm()
            if not math.isfinite(grad_norm):
                self.engine.optimizer.zero_grad(set_to_none=True)
                return {**metrics, "train/nonfinite_steps": 1.0, "train/grad_norm": float("nan")}
            self.engine.step()
        else:
            self.engine.step()  # ZeRO checks the reduced gradients and skips a non-finite step itself
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else float("nan")
            if not self.engine.was_step_applied() or not math.isfinite(grad_norm):
                return {**metrics, "train/nonfinite_steps": 1.0, "train/grad_norm": float("nan")}
        return {**metrics, "train/nonfinite_steps": 0.0, "train/grad_norm": grad_norm}

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

    @contextmanager
    def _hf_model(self, write_back: bool = False, modifier_rank: int | None = None):
        """The model as a plain transformers model: ZeRO-3 parameters gathered, DeepSpeed-MoE blocks swapped back."""
        model = self.engine.module
        if self.params.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=modifier_rank):
                yield model
        elif self.params.moe == "deepspeed":
            from rlzoo.models.deepspeed_moe import hf_layout

            with hf_layout(model, write_back=write_back):
                yield model
        else:
            yield model

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint-format weights. A collective under ZeRO-3 and expert parallelism (all ranks call it)."""
        from rlzoo.models.export import checkpoint_weights

        if self.params.zero_stage < 3 and self.params.moe == "none":
            return checkpoint_weights(self.engine.module)  # views of the live (full) parameters, as the torch engine
        with self._hf_model() as model:
            # copies: gathered ZeRO-3 parameters are released and swapped-in expert tensors dropped on exit
            return [(name, tensor.clone()) for name, tensor in checkpoint_weights(model)]

    def save(self, directory: Path) -> None:
        """``directory/model`` (HF folder, rank 0), ``deepspeed.json`` and per-rank optimizer state. Collective."""
        import torch.distributed as dist

        directory = Path(directory)
        with self._hf_model() as model:
            if self.rank == 0:
                model.save_pretrained(directory / "model", safe_serialization=True)
        rank_dir = directory / "optimizer" / f"rank{self.rank:05d}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        with self._torch_optimizer() as optimizer:
            save_optimizer(optimizer, rank_dir)
        if self.rank == 0:
            (directory / "deepspeed.json").write_text(json.dumps(self._layout(), indent=1))
        if self.world_size > 1:
            dist.barrier()

    def load_state(self, directory: Path) -> None:
        """Restore weights (master copies included) and optimizer state written by :meth:`save`. Collective."""
        from safetensors.torch import load_file

        from rlzoo.models.weights import load_checkpoint_weights

        directory = Path(directory)
        layout_file = directory / "deepspeed.json"
        if not layout_file.is_file():
            raise FileNotFoundError(f"{directory} has no deepspeed.json: not a checkpoint of the deepspeed engine")
        saved = json.loads(layout_file.read_text())
        if saved != self._layout():
            raise ValueError(f"checkpoint {directory} was written with {saved}; this engine is {self._layout()}:"
                             " resuming needs the same ZeRO stage, moe, ep_size and world size")
        files = sorted((directory / "model").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{directory / 'model'} holds no safetensors weights")
        with self._hf_model(write_back=True, modifier_rank=0) as model:
            if self.params.zero_stage < 3 or self.rank == 0:
                weights: dict[str, torch.Tensor] = {}  # load_checkpoint_weights checks that nothing is missing
                for file in files:
                    weights.update(load_file(str(file)))
                load_checkpoint_weights(model, weights.items())
        if self.params.zero_stage > 0:
            self.engine.optimizer.refresh_fp32_params()  # master partitions from the loaded fp32 weights
        with self._torch_optimizer() as optimizer:
            load_optimizer(optimizer, directory / "optimizer" / f"rank{self.rank:05d}")
        if hasattr(self.engine.optimizer, "_hp_optimizer_states_linked"):
            self.engine.optimizer._hp_optimizer_states_linked = False  # re-link DeepSpeed's views on the new state

    @contextmanager
    def _torch_optimizer(self):
        """The torch AdamW that holds the state: the client optimizer itself at ZeRO 0, ZeRO's inner one above.

        ZeRO-3 keeps the inner optimizer's parameter groups empty between steps; they are filled with this rank's
        fp32 partitions while the state is read or written, as DeepSpeed's own checkpointing does.
        """
        optimizer = self.engine.optimizer
        if self.params.zero_stage == 0:
            yield optimizer
        elif self.params.zero_stage == 3:
            optimizer._set_fp32_optimizer_param_groups()
            try:
                yield optimizer.optimizer
            finally:
                optimizer._clear_fp32_optimizer_param_groups()
        else:
            yield optimizer.optimizer

    def _layout(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "zero_stage": self.params.zero_stage,
            "moe": self.params.moe,
            "ep_size": self.params.ep_size,
            "world_size": self.world_size,
        }


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The top-k routers (``mlp.gate``) of the model's sparse MoE blocks, transformers or DeepSpeed-MoE."""
    from rlzoo.models.deepspeed_moe import DeepSpeedMoEBlock, is_hf_sparse_moe_block

    return [m.gate for m in model.modules() if isinstance(m, DeepSpeedMoEBlock) or is_hf_sparse_moe_block(m)]


def load_balancing_loss(
    router_logits: list[torch.Tensor], num_experts: int, top_k: int, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` (Switch Transformer) over all layers, padding excluded.

    ``E * sum_e f_e * P_e``: ``f_e`` the share of (non-padding) tokens whose top-k includes expert ``e`` and
    ``P_e`` their mean router probability, both accumulated over every MoE layer.
    """
    device = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    weight = attention_mask.reshape(-1).to(device=device, dtype=torch.float32) if attention_mask is not None else None
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        _, chosen = torch.topk(probs, top_k, dim=-1)
        w = weight if weight is not None else torch.ones(probs.shape[0], device=device)
        counts = counts.scatter_add(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        prob_sum = prob_sum + (probs * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    return torch.sum((counts / rows) * (prob_sum / rows)) * num_experts
