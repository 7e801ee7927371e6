"""Loading Hugging-Face *checkpoint-format* weights (per-expert names) into a live transformers model.

transformers 5 fuses MoE experts in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj``
``[E, H, I]``) while checkpoints and vLLM use per-expert names (``mlp.experts.{e}.gate_proj.weight``...).
Weight sync speaks the checkpoint format, so every engine can consume it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

_EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@torch.no_grad()
def load_checkpoint_weights(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    seen: set[str] = set()
    for name, tensor in named_tensors:
        match = _EXPERT.match(name)
        if match is None:
            if name not in params:
                raise KeyError(f"weight {name!r} does not exist in {type(model).__name__}")
            params[name].copy_(tensor)
            seen.add(name)
            continue
        prefix, expert, proj = match["prefix"], int(match["e"]), match["proj"]
        if proj == "down_proj":
            target = params[f"{prefix}.down_proj"]
            target[expert].copy_(tensor)
            seen.add(f"{prefix}.down_proj")
        else:
            target = params[f"{prefix}.gate_up_proj"]
            half = target.shape[1] // 2
            rows = slice(0, half) if proj == "gate_proj" else slice(half, 2 * half)
            target[expert, rows].copy_(tensor)
            seen.add(f"{prefix}.gate_up_proj")
    missing = set(dict(model.named_parameters())) - seen
    if missing:
        raise KeyError(f"weight sync left {len(missing)} parameters unset, e.g. {sorted(missing)[:3]}")
