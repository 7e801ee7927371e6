"""transformers MoE blocks as DeepSpeed-MoE layers, with routing that matches the Hugging Face router exactly.

:func:`convert_to_deepspeed_moe` replaces every sparse MoE block of a transformers model (Qwen3-MoE and other
models whose block is ``gate`` = a ``*TopKRouter`` returning ``(logits, scores, indices)`` plus ``experts`` = fused
``gate_up_proj`` ``[E, 2I, H]`` / ``down_proj`` ``[E, H, I]``) by a :class:`DeepSpeedMoEBlock`:

- ``block.gate`` is the *same* Hugging Face router module. The block calls ``self.gate(hidden)`` and dispatches
  with the ``(scores, indices)`` it returns, so a hook on ``mlp.gate`` (routing replay, expert capture) acts on
  both the transformers path and the DeepSpeed path alike.
- ``block.moe`` is a ``deepspeed.moe.layer.MoE`` whose DeepSpeed gate is replaced by :class:`HFRoutedGate`: no
  noise, no capacity limit, no token dropping; the capacity is the largest per-expert token count (the maximum
  over the expert-parallel group), so every routed (token, expert) pair is computed. Its expert ``e`` is an
  :class:`ExpertMLP` holding ``gate_up_proj`` = HF ``gate_up_proj[e]`` and ``down_proj`` = HF ``down_proj[e]``,
  the same fused matmuls as transformers' eager experts. With ``ep_size`` 1 there is nothing to exchange and the block bypasses
  ``MOELayer``'s capacity-padded dispatch: its experts run grouped by expert on exactly their tokens
  (:meth:`DeepSpeedMoEBlock._grouped_experts`, the computation of transformers' ``grouped_mm`` experts).
- With expert parallelism (``ep_size`` > 1) each rank of an expert-parallel group holds ``E / ep_size``
  consecutive experts (rank ``r`` of the group: experts ``r * E/ep .. (r+1) * E/ep - 1``), as DeepSpeed's
  all-to-all dispatch expects.

The weight mapping is a pure copy of slices in both directions (:func:`convert_to_deepspeed_moe` and
:func:`hf_layout`/:func:`restore_hf_blocks`), so a round trip is bit-exact. :func:`hf_layout` temporarily puts
rebuilt transformers blocks back (gathering the experts of all expert-parallel ranks), which is how the engine
saves a loadable Hugging Face folder and yields checkpoint-format weights.

The router's auxiliary load-balancing loss of the last forward pass is ``block.l_aux``:
:func:`rlzoo.moe.load_balancing_loss` of this layer's router logits, differentiable through the router (the
training engine adds the all-layer loss from the same logits; it does not read ``l_aux``). Importing this module
needs DeepSpeed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from transformers.activations import ACT2FN

from deepspeed.moe.layer import MoE

from rlzoo.moe.balance import load_balancing_loss


def is_hf_sparse_moe_block(module: nn.Module) -> bool:
    """A transformers sparse MoE block: a top-k router ``gate`` and fused 3-D ``experts``."""
    gate = getattr(module, "gate", None)
    experts = getattr(module, "experts", None)
    return (
        gate is not None
        and experts is not None
        and hasattr(gate, "top_k")
        and hasattr(gate, "num_experts")
        and isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor)
        and isinstance(getattr(experts, "down_proj", None), torch.Tensor)
        and getattr(experts, "gate_up_proj").dim() == 3
    )


class ExpertMLP(nn.Module):
    """One expert, computed exactly as transformers' eager fused experts do for expert ``e``."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = ACT2FN[hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class HFRoutedGate(nn.Module):
    """A DeepSpeed-MoE gate that dispatches the routing the Hugging Face router already chose.

    It has no parameters and no randomness. :class:`DeepSpeedMoEBlock` hands it ``(logits, scores, indices)``
    right before calling the DeepSpeed layer; it returns what ``MOELayer`` expects from a gate in sparse-route
    form: ``(l_aux, capacity, num_experts, indices [k, S], locations [k, S], gates [k, S], expert_counts)``.
    """

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.ep_group = None
        self.routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group) -> None:  # called by DeepSpeed's MoE.set_deepspeed_parallelism
        self.ep_group = ep_group

    def forward(self, input, used_token=None, sparse_routes=True, use_tutel=False):  # noqa: A002 (DeepSpeed API)
        if self.routing is None:
            raise RuntimeError("HFRoutedGate called without routing: call the DeepSpeedMoEBlock, not its MoE layer")
        if used_token is not None:
            raise NotImplementedError("used_token masks are not supported: the HF router routes every token")
        if use_tutel:
            raise NotImplementedError("Tutel dispatch is not supported by HFRoutedGate")
        logits, scores, indices = self.routing
        self.routing = None
        num_tokens = input.shape[0]
        indices = indices.reshape(num_tokens, -1).long()
        scores = scores.reshape(num_tokens, -1)
        mask = torch.zeros(num_tokens, self.num_experts, dtype=torch.long, device=indices.device)
        mask.scatter_(1, indices, 1)
        counts = mask.sum(dim=0)
        # position of each (token, expert) pair in its expert's queue; tokens keep their order
        locations = (torch.cumsum(mask, dim=0) - 1).gather(1, indices)
        capacity = counts.max().clamp(min=1)
        if self.ep_group is not None and dist.is_initialized() and dist.get_world_size(self.ep_group) > 1:
            dist.all_reduce(capacity, op=dist.ReduceOp.MAX, group=self.ep_group)
        # the MOELayer contract wants the layer's load-balancing loss; the engine's aux term is computed from the
        # same router logits by rlzoo.moe.balance, the one implementation of the formula
        l_aux = load_balancing_loss([logits.reshape(num_tokens, -1)], self.num_experts, indices.shape[1], None)
        if not sparse_routes:
            raise NotImplementedError("HFRoutedGate only produces sparse routes (DeepSpeed >= 0.19 MOELayer)")
        return (
            l_aux,
            capacity,
            self.num_experts,
            indices.t().contiguous().to(torch.int32),
            locations.t().contiguous().to(torch.int32),
            scores.float().t().contiguous(),
            counts.detach(),
        )


class DeepSpeedMoEBlock(nn.Module):
    """A transformers sparse MoE block computed by DeepSpeed-MoE, routed by the Hugging Face router ``gate``."""

    def __init__(self, gate: nn.Module, moe: MoE, hidden_size: int, intermediate_size: int, hidden_act: str,
                 ep_rank: int) -> None:
        super().__init__()
        self.gate = gate
        self.moe = moe
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.num_experts = moe.num_experts
        self.num_local_experts = moe.num_local_experts
        self.ep_size = moe.ep_size
        self.ep_rank = ep_rank
        self.l_aux: torch.Tensor | None = None

    @property
    def local_experts(self) -> nn.ModuleList:
        return self.moe.deepspeed_moe.experts.deepspeed_experts

    @property
    def first_local_expert(self) -> int:
        return self.ep_rank * self.num_local_experts

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        logits, scores, indices = self.gate(flat)
        if self.ep_size == 1:
            # nothing to exchange between ranks: skip MOELayer's capacity-padded [E, capacity, H] dispatch (every
            # expert padded to the busiest one's token count, one small matmul per expert)
            self.l_aux = load_balancing_loss([logits], self.num_experts, indices.shape[-1], None)
            return self._grouped_experts(flat, scores, indices).reshape(shape)
        self.moe.deepspeed_moe.gate.routing = (logits, scores, indices)
        output, l_aux, _ = self.moe(flat)
        self.l_aux = l_aux
        return output.reshape(shape)

    def _grouped_experts(self, flat: torch.Tensor, scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """All experts on this rank's tokens, computed as transformers' ``grouped_mm`` experts do.

        The ``N * k`` (token, expert) pairs are sorted by expert, each expert multiplies exactly its tokens
        (one grouped matmul for ``gate_up_proj``, one for ``down_proj``, over the experts' weights stacked to
        ``[E, 2I, H]`` / ``[E, H, I]``), the outputs are weighted by the router's scores and summed per token
        in the original order: ``y_n = sum_j s_nj * down_e(act(gate_e(x_n)) * up_e(x_n))`` with ``e = i_nj``.
        The same operations in the same order as the Hugging Face block, so the result matches it bit for bit
        when transformers uses its ``grouped_mm`` experts (its default).
        """
        experts = self.local_experts
        gate_up = torch.stack([e.gate_up_proj.weight for e in experts])  # [E, 2I, H]
        down = torch.stack([e.down_proj.weight for e in experts])  # [E, H, I]
        k = indices.shape[-1]
        ids, perm = torch.sort(indices.reshape(-1))  # [N*k]
        tokens = flat[perm // k].to(gate_up.dtype)  # [N*k, H]
        offsets = torch.cumsum(torch.bincount(ids, minlength=self.num_experts), dim=0, dtype=torch.int32)
        gate, up = _grouped_mm(tokens, gate_up.transpose(-2, -1), offsets).chunk(2, dim=-1)  # [N*k, I] each
        out = _grouped_mm((experts[0].act_fn(gate) * up).to(down.dtype), down.transpose(-2, -1), offsets)
        out = out * scores.reshape(-1)[perm].unsqueeze(-1)  # [N*k, H]
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        return out[inverse].view(flat.shape[0], k, -1).sum(dim=1).to(flat.dtype)  # [N, H]

    # -- weights in the transformers layout ------------------------------------------------------------------

    @torch.no_grad()
    def local_fused(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's experts as ``gate_up_proj`` ``[E_local, 2I, H]`` and ``down_proj`` ``[E_local, H, I]``."""
        gate_up = torch.stack([e.gate_up_proj.weight.detach() for e in self.local_experts])
        down = torch.stack([e.down_proj.weight.detach() for e in self.local_experts])
        return gate_up, down

    @torch.no_grad()
    def fused(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All experts in the transformers layout, gathered over the expert-parallel group (a collective)."""
        gate_up, down = self.local_fused()
        group = self.moe.deepspeed_moe.ep_group
        if self.ep_size == 1:
            return gate_up, down
        if group is None:
            raise RuntimeError("expert-parallel block has no process group: initialise it with DeepSpeed first")
        parts = []
        for local in (gate_up, down):
            gathered = [torch.empty_like(local) for _ in range(self.ep_size)]
            dist.all_gather(gathered, local.contiguous(), group=group)
            parts.append(torch.cat(gathered))
        return parts[0], parts[1]

    @torch.no_grad()
    def load_fused(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
        """Copy this rank's slice of transformers-layout expert weights (all ``E`` experts) into the block."""
        start = self.first_local_expert
        for j, expert in enumerate(self.local_experts):
            expert.gate_up_proj.weight.copy_(gate_up_proj[start + j])
            expert.down_proj.weight.copy_(down_proj[start + j])

    def to_hf_block(self, fused: tuple[torch.Tensor, torch.Tensor] | None = None) -> nn.Module:
        """A transformers block with the same router module and (gathered) expert weights."""
        original = self._hf_template
        block = copy.copy(original)  # shallow: a fresh module object sharing the class and settings
        block._modules = dict(original._modules)
        block._parameters = dict(original._parameters)
        block._buffers = dict(original._buffers)
        experts = copy.copy(original.experts)
        experts._parameters = dict(original.experts._parameters)
        gate_up, down = fused if fused is not None else self.fused()
        experts._parameters["gate_up_proj"] = nn.Parameter(gate_up.clone(), requires_grad=False)
        experts._parameters["down_proj"] = nn.Parameter(down.clone(), requires_grad=False)
        block._modules["experts"] = experts
        block._modules["gate"] = self.gate
        return block


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``x[rows of group g] @ weight[g]`` for consecutive row groups ending at ``offsets`` (int32, cumulative)."""
    return torch.nn.functional.grouped_mm(x, weight, offs=offsets)


def _expert_group_rank(ep_size: int) -> int:
    """This process's rank in its expert-parallel group under DeepSpeed's default (expert-then-data) layout."""
    if ep_size == 1:
        return 0
    if not dist.is_initialized():
        raise RuntimeError("ep_size > 1 needs torch.distributed to be initialised before converting the model")
    world = dist.get_world_size()
    if world % ep_size:
        raise ValueError(f"ep_size={ep_size} must divide the world size {world}")
    return dist.get_rank() % ep_size


def _hf_blocks(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    found = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if is_hf_sparse_moe_block(child):
                found.append((module, child_name, child))
    return found


def _ds_blocks(model: nn.Module) -> list[tuple[nn.Module, str, DeepSpeedMoEBlock]]:
    found = []
    for _, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, DeepSpeedMoEBlock):
                found.append((module, child_name, child))
    return found


def deepspeed_moe_blocks(model: nn.Module) -> list[DeepSpeedMoEBlock]:
    return [block for _, _, block in _ds_blocks(model)]


@torch.no_grad()
def convert_to_deepspeed_moe(model: nn.Module, ep_size: int = 1) -> int:
    """Replace every transformers sparse MoE block of ``model`` in place; returns how many were converted.

    Every rank passes the full model; each keeps only the experts of its expert-parallel rank.
    """
    config = getattr(model, "config", None)
    hidden_act = getattr(config, "hidden_act", "silu")
    ep_rank = _expert_group_rank(ep_size)
    count = 0
    for parent, name, block in _hf_blocks(model):
        experts, gate = block.experts, block.gate
        num_experts, two_i, hidden = experts.gate_up_proj.shape
        if num_experts % ep_size:
            raise ValueError(f"{num_experts} experts cannot be split over ep_size={ep_size}")
        intermediate = two_i // 2
        template = ExpertMLP(hidden, intermediate, getattr(experts, "hidden_act", hidden_act))
        template.to(device=experts.gate_up_proj.device, dtype=experts.gate_up_proj.dtype)
        moe = MoE(
            hidden_size=hidden,
            expert=template,
            num_experts=num_experts,
            ep_size=ep_size,
            k=gate.top_k,
            capacity_factor=1.0,
            eval_capacity_factor=1.0,
            min_capacity=0,
            noisy_gate_policy=None,
            drop_tokens=False,
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        moe.deepspeed_moe.gate = HFRoutedGate(num_experts)
        if hasattr(experts, "act_fn"):
            for expert in moe.deepspeed_moe.experts.deepspeed_experts:
                expert.act_fn = experts.act_fn
        new = DeepSpeedMoEBlock(gate, moe, hidden, intermediate, hidden_act, ep_rank)
        new.load_fused(experts.gate_up_proj.detach(), experts.down_proj.detach())
        # keep a parameter-free skeleton of the transformers block for hf_layout / restore_hf_blocks
        skeleton = copy.copy(block)
        skeleton._modules = {k: v for k, v in block._modules.items()}
        skeleton_experts = copy.copy(experts)
        skeleton_experts._parameters = {}
        skeleton._modules["experts"] = skeleton_experts
        object.__setattr__(new, "_hf_template", skeleton)  # not a registered submodule
        new.train(block.training)
        setattr(parent, name, new)
        count += 1
    return count


@torch.no_grad()
def restore_hf_blocks(model: nn.Module) -> int:
    """Inverse of :func:`convert_to_deepspeed_moe`: put transformers blocks back (a collective under EP)."""
    count = 0
    for parent, name, block in _ds_blocks(model):
        hf = block.to_hf_block()
        for key in ("gate_up_proj", "down_proj"):
            hf.experts._parameters[key].requires_grad_(True)
        setattr(parent, name, hf)
        count += 1
    return count


@contextmanager
def hf_layout(model: nn.Module, write_back: bool = False) -> Iterator[nn.Module]:
    """Temporarily give ``model`` its transformers MoE blocks back (experts gathered over the EP group).

    Inside the block the model is a plain transformers model (``save_pretrained``, checkpoint-format export,
    ``load_checkpoint_weights``); the expert tensors are copies, the router and every other parameter are the
    live ones. With ``write_back`` the (possibly changed) expert tensors are copied back into the DeepSpeed-MoE
    experts on a normal exit. A collective when ``ep_size`` > 1: every rank of the group must enter it.
    """
    swapped = []
    try:
        for parent, name, block in _ds_blocks(model):
            hf = block.to_hf_block()
            setattr(parent, name, hf)
            swapped.append((parent, name, block, hf))
        yield model
        if write_back:
            for _, _, block, hf in swapped:
                block.load_fused(hf.experts.gate_up_proj.detach(), hf.experts.down_proj.detach())
    finally:
        for parent, name, block, _ in swapped:
            setattr(parent, name, block)
