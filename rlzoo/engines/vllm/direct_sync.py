"""Weight sync by direct copies into vLLM's own tensors, on CPU (the ``weight_sync: direct`` path).

vLLM's ``reload_weights`` (the ``reload`` path) replays a full checkpoint load layer by layer: it rebuilds every layer
on the meta device, routes each checkpoint tensor through the parameter's ``weight_loader`` (one call per expert and
projection: ~100 calls per sync on the 2-layer tiny MoE), re-processes the layer and copies the result back. On small
models that bookkeeping is most of the sync (``benchmarks/sync_speed.py``; numbers in docs/benchmarks.md).

This path assembles each of vLLM's fused tensors from the checkpoint names itself and writes it in place:

- ``q_proj`` / ``k_proj`` / ``v_proj`` → ``qkv_proj`` and ``gate_proj`` / ``up_proj`` → ``gate_up_proj``: the
  model's own ``packed_modules_mapping``; shards are stacked along the output dimension in the listed order
  (tensor parallel size 1, as on CPU);
- ``experts.{e}.gate_proj`` / ``up_proj`` → ``w13_weight[e]`` (gate rows first) and ``experts.{e}.down_proj``
  → ``w2_weight[e]`` of the module under ``experts`` that holds them (``experts.routed_experts`` in vLLM 0.32): vLLM's
  ``FusedMoE.make_expert_params_mapping`` convention; the CPU grouped-GEMM prepack is then re-applied
  (:meth:`rlzoo.engines.vllm.worker.RlzooWorkerExtension.rlzoo_repack_cpu_moe`);
- every other name is a parameter of the same name (norms, embeddings, routers, ``lm_head``).

On CPU vLLM keeps a linear layer's weight only inside a packed kernel handle (``layer.cpu_linear``, built by
``dispatch_cpu_unquantized_gemm``; the weight parameter itself is emptied). Such a layer gets a fresh weight and its
``quant_method.process_weights_after_loading`` runs again, which rebuilds the handle exactly as the first load did;
layers that keep their weight (embeddings, whose handle serves a tied or separate LM head) are written in place and
re-dispatched the same way.

The plan is checked on every call: a name that maps to nothing, a shape that differs, or a vLLM parameter left
without new values raises :class:`DirectSyncUnsupported`, so the engine can fall back to ``reload`` rather than run
on stale weights. ``integration_tests/test_vllm_engine.py`` checks that both paths give bit-identical log-probs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

_EXPERT = re.compile(
    r"^(?P<layer>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
#: checkpoint projection → (fused parameter, shard index within it); w1/w3/w2 are Mixtral's names for the same
_EXPERT_SHARDS = {
    "gate_proj": ("w13_weight", 0),
    "w1": ("w13_weight", 0),
    "up_proj": ("w13_weight", 1),
    "w3": ("w13_weight", 1),
    "down_proj": ("w2_weight", 0),
    "w2": ("w2_weight", 0),
}


class DirectSyncUnsupported(NotImplementedError):
    """The direct path cannot place these weights in this vLLM model (the ``reload`` path can)."""


@dataclass
class _Target:
    """One vLLM parameter and the checkpoint pieces that make it: ``shards[(expert, shard)] = tensor``."""

    module: torch.nn.Module
    param_name: str
    shards: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


def _shard_index(model: torch.nn.Module) -> dict[str, tuple[str, int]]:
    """``{"q_proj": ("qkv_proj", 0), ...}`` from the model's ``packed_modules_mapping``."""
    mapping = getattr(model, "packed_modules_mapping", None) or {}
    return {part: (fused, i) for fused, parts in mapping.items() for i, part in enumerate(parts)}


def _expert_owner(modules: dict[str, torch.nn.Module], layer: str, param_name: str) -> str:
    """The module under ``layer`` holding the fused expert tensor (vLLM 0.32: ``experts.routed_experts``)."""
    owners = [name for name in modules if name.startswith(f"{layer}.") and param_name in modules[name]._parameters]
    return owners[0] if len(owners) == 1 else layer


def _plan(
    model: torch.nn.Module, modules: dict[str, torch.nn.Module], weights: Iterable[tuple[str, torch.Tensor]]
) -> dict[tuple[str, str], _Target]:
    """Group the checkpoint tensors by the vLLM parameter they belong to."""
    shard_of = _shard_index(model)
    targets: dict[tuple[str, str], _Target] = {}
    owners: dict[tuple[str, str], str] = {}
    for name, tensor in weights:
        expert = _EXPERT.match(name)
        if expert:
            module_name, (param_name, shard) = expert["layer"], _EXPERT_SHARDS[expert["proj"]]
            key = (int(expert["expert"]), shard)
        else:
            module_name, _, param_name = name.rpartition(".")
            parent, _, leaf = module_name.rpartition(".")
            key = (0, 0)
            if module_name not in modules and leaf in shard_of:
                fused, shard = shard_of[leaf]
                module_name, key = f"{parent}.{fused}" if parent else fused, (0, shard)
        if expert and module_name in modules and param_name not in modules[module_name]._parameters:
            if (module_name, param_name) not in owners:
                owners[module_name, param_name] = _expert_owner(modules, module_name, param_name)
            module_name = owners[module_name, param_name]
        module = modules.get(module_name)
        if module is None or param_name not in module._parameters:
            raise DirectSyncUnsupported(f"no vLLM parameter for checkpoint weight {name!r}")
        target = targets.setdefault((module_name, param_name), _Target(module, param_name))
        if key in target.shards:
            raise DirectSyncUnsupported(f"checkpoint weight {name!r} arrives twice")
        target.shards[key] = tensor
    return targets


def _assemble(target: _Target, experts: int | None) -> torch.Tensor:
    """The full tensor for one target: shards stacked along dim 0, per expert along a leading expert dim."""
    by_expert: dict[int, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for (expert, shard), tensor in target.shards.items():
        by_expert[expert].append((shard, tensor))
    try:
        rows = [torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])]) for _, parts in sorted(by_expert.items())]
        if experts is None:
            return rows[0]
        if len(rows) != experts:
            raise DirectSyncUnsupported(f"{target.param_name}: {len(rows)} of {experts} experts arrived")
        return torch.stack(rows)
    except RuntimeError as exc:  # shards of different widths, or experts of different shapes
        raise DirectSyncUnsupported(f"{target.param_name}: checkpoint shards do not fit together ({exc})") from exc


def _removed_shape(module: torch.nn.Module) -> tuple[int, int]:
    """The weight shape of a linear layer whose weight vLLM emptied (its ``LinearBase`` sizes, this rank's part)."""
    try:
        return (
            getattr(module, "output_size_per_partition", None) or module.output_size,
            getattr(module, "input_size_per_partition", None) or module.input_size,
        )
    except AttributeError:
        raise DirectSyncUnsupported(f"cannot tell the weight shape of {type(module).__name__}") from None


def _kernel_packed(module: torch.nn.Module) -> bool:
    """Whether vLLM's CPU linear dispatch holds this layer's weight in a packed handle (rebuilt after a write)."""
    return callable(getattr(module, "cpu_linear", None)) and hasattr(module, "quant_method")


@torch.no_grad()
def copy_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Write checkpoint-format ``weights`` into ``model`` (vLLM's, on CPU); returns the number of tensors written.

    Raises :class:`DirectSyncUnsupported` before writing anything if the weights do not cover the model exactly.
    """
    modules = dict(model.named_modules())
    targets = _plan(model, modules, weights)
    written = {id(t.module._parameters[t.param_name]) for t in targets.values()}
    packed = {name: m for name, m in modules.items() if _kernel_packed(m)}
    needed = [(n, p) for n, p in model.named_parameters() if p.numel()]
    needed += [(name, m.weight) for name, m in packed.items()]
    missing = sorted({n for n, p in needed if id(p) not in written})
    if missing:
        raise DirectSyncUnsupported(f"no new values for vLLM parameter(s) {missing[:5]}")
    staged = []
    for (module_name, param_name), target in targets.items():
        param = target.module._parameters[param_name]
        moe = param_name in ("w13_weight", "w2_weight")
        value = _assemble(target, param.shape[0] if moe else None)
        removed = param.numel() == 0 and _kernel_packed(target.module)
        shape = _removed_shape(target.module) if removed else tuple(param.shape)
        fits = (
            tuple(value.shape) == shape
            or not removed
            and (
                # vocab rows padded by vLLM (embeddings, LM head): the padding rows are never read
                value.dim() == param.dim() == 2
                and value.shape[1] == param.shape[1]
                and value.shape[0] <= param.shape[0]
            )
        )
        if not fits:
            raise DirectSyncUnsupported(
                f"{module_name}.{param_name}: checkpoint gives {tuple(value.shape)}, vLLM holds {shape}"
            )
        staged.append((target.module, param_name, param, value, removed))
    for module, param_name, param, value, removed in staged:
        if removed:  # the kernel handle is the only copy: give the layer a weight to rebuild the handle from
            fresh = value.to(param.dtype, copy=True)  # never the caller's storage: the trainer updates it next
            module._parameters[param_name] = torch.nn.Parameter(fresh, requires_grad=False)
        else:
            param.data[: value.shape[0]].copy_(value)
    # every packed handle built from a written weight, a tied LM head sharing the embedding's weight included
    for module in packed.values():
        if id(module.weight) in written or any(module is m for m, *_ in staged):
            module.quant_method.process_weights_after_loading(module)
    return len(staged)
