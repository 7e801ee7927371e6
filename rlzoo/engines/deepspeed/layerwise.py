"""The weights of a ZeRO-3 model in checkpoint format, gathered one layer at a time.

Why: under ZeRO-3 each rank holds a 1/world share of every parameter. Gathering all of them at once
(``deepspeed.zero.GatheredParameters`` over ``model.parameters()``, as :func:`rlzoo.engines.deepspeed.checkpoint.hf_model`
does for a checkpoint) materialises the whole fp32 model on every rank: ~122 GB for a 30B model, which no GPU holds.
:func:`layerwise_weights` gathers one *unit* at a time instead (a decoder layer, or a single tensor outside the layers:
embeddings, final norm, output layer), yields that unit's checkpoint-format ``(name, tensor)`` pairs and releases the
unit before gathering the next, so at most one unit's full parameters (plus the one copy the consumer holds) exist
at any moment.

The names and values are exactly :func:`rlzoo.models.export.checkpoint_state` of the whole model, in the same order
(``tests/test_layerwise_weights.py`` and ``integration_tests/test_deepspeed_layerwise.py`` compare them with
``torch.equal`` at 1 and 2 processes):

- a unit is a prefix subtree of the state-dict names (everything under ``model.layers.N``, or one name), so the
  transformers conversions that fuse or split tensors (the MoE experts) see all of a layer's tensors together;
- tied weights (``lm_head.weight`` sharing ``model.embed_tokens.weight``) go with the first name of the shared
  tensor, where transformers' ``remove_tied_weights_from_state_dict`` finds both and drops the alias as it does for
  the whole model;
- units are visited in the order the whole model's names come out: ``revert_weight_conversion`` sorts them by
  ``dot_natural_key`` when it converts anything (a unit's names are contiguous in that order), and hands the state
  dict back in module order when it converts nothing (a dense model).

The iterator is a collective: each unit's gather is an all-gather over the ranks, so every rank must consume it to the
end, in lockstep, including ranks that receive nothing (:meth:`rlzoo.rl.learner.Learner.push_weights` drains it
there). Each tensor yielded is a copy, valid after the unit is released.

Not covered (those keep the whole gather, :meth:`rlzoo.engines.deepspeed.trainer.DeepSpeedTrainingEngine.named_weights`):
LoRA's merged weights (``merged_state`` merges over the whole peft model; ZeRO-3 under LoRA is refused at the
start-up check anyway), and DeepSpeed-MoE's expert-parallel layout, which swaps the experts of every block back at
once (ZeRO 0-2 only: DeepSpeed refuses its MoE at ZeRO-3, so no gather of partitioned weights is involved).

References: DeepSpeed's ``deepspeed.zero.GatheredParameters`` (``runtime/zero/partition_parameters.py``); verl's
``per_tensor_generator`` (``verl/utils/megatron_utils.py``), the peer: its weight sync to the rollout engine walks the
Megatron model and yields one converted tensor at a time instead of materialising the whole state dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

StateFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], Iterator[tuple[str, torch.Tensor]]]


def unit_of(name: str) -> str:
    """The unit ``name`` is gathered with: the prefix up to its first numeric component (``model.layers.3`` for
    every tensor of decoder layer 3, whatever is nested below: experts, attention, norms), else the name itself."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name


def weight_units(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[list[str]]:
    """The names of ``state`` (``model.state_dict(keep_vars=True)``: the parameters themselves) grouped into units,
    in the order the checkpoint conversion emits them. A name whose tensor an earlier name already holds (a tied
    weight) joins that name's unit."""
    units: dict[str, list[str]] = {}
    home: dict[int, str] = {}
    for name, tensor in state.items():
        units.setdefault(home.setdefault(id(tensor), unit_of(name)), []).append(name)
    order = _emitted_order(model)
    if order is None:  # the whole-model path keeps state-dict order, as the units do
        return list(units.values())
    # a unit's own names (not a tied alias) place it: they are contiguous in the emitted order
    return [units[u] for u in sorted(units, key=lambda u: min(order(n) for n in units[u] if unit_of(n) == u))]


def _emitted_order(model: torch.nn.Module) -> Callable[[str], Any] | None:
    """``dot_natural_key`` when transformers' ``revert_weight_conversion`` converts ``model``'s weights (it sorts the
    names that way first); ``None`` when it hands the state dict back as it is (no conversion for this model), or
    when transformers has no such helper (:func:`rlzoo.models.export.checkpoint_state` then keeps state-dict order)."""
    try:
        from transformers.core_model_loading import dot_natural_key, revert_weight_conversion
    except ImportError:
        return None
    probe: dict[str, torch.Tensor] = {}
    return None if revert_weight_conversion(model, probe) is probe else dot_natural_key


def largest_unit(model: torch.nn.Module) -> int:
    """The most parameter elements one unit holds (the gather's bound; ZeRO-3 parameters count at their full size)."""
    state = model.state_dict(keep_vars=True)
    sizes = []
    for names in weight_units(model, state):
        params = {id(t): t for n in names if isinstance(t := state[n], torch.nn.Parameter)}
        sizes.append(sum(_full_numel(p) for p in params.values()))
    return max(sizes, default=0)


def _full_numel(param: torch.nn.Parameter) -> int:
    return int(param.ds_numel) if hasattr(param, "ds_numel") else param.numel()


@torch.no_grad()
def layerwise_weights(model: torch.nn.Module, state_fn: StateFn | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint-format ``(name, tensor)`` of a ZeRO-3 ``model``, one unit gathered at a time (module docstring).

    ``state_fn(model, partial_state)`` turns one unit's in-memory tensors into checkpoint names and tensors; by
    default :func:`rlzoo.models.export.checkpoint_state`. A collective: every rank consumes it to the end.
    """
    import deepspeed

    from rlzoo.models.export import checkpoint_state

    convert = state_fn or checkpoint_state
    state = model.state_dict(keep_vars=True)  # the Parameter objects: gathering fills their .data in place
    for names in weight_units(model, state):
        params = list({id(t): t for n in names if isinstance(t := state[n], torch.nn.Parameter)}.values())
        with deepspeed.zero.GatheredParameters(params):
            for name, tensor in convert(model, {n: state[n].detach() for n in names}):
                yield name, tensor.clone()  # the gathered storage is released when the next unit starts
