"""Gate functions: how a router turns its logits and chosen experts into the experts' weights.

Replay recomputes the scores from ``router_logits`` with one of these, chosen per router on its first call by
checking which one reproduces the router's own scores bit for bit (:func:`detect_gate`; an error names the router
if none does, e.g. sigmoid / bias-corrected / grouped routers):

- ``softmax-topk-renorm``: ``p = softmax(logits, fp32)``; ``g = p[idx] / sum(p[idx])`` (Qwen2/3-MoE with
  ``norm_topk_prob``, Mixtral, OLMoE with ``norm_topk_prob``, FlexOlmo, MiniMax, Qwen3-Next / Qwen3.5-MoE / Qwen3-VL-MoE)
- ``softmax-topk``: ``g = p[idx]`` (the same routers with ``norm_topk_prob=False``; OLMoE's default)
- ``topk-softmax``: ``g = softmax(logits[idx])`` (GPT-OSS)
"""

from __future__ import annotations

import torch

from rlzoo.moe.routers import RouterInfo, RoutingError

GATE_FUNCTIONS = ("softmax-topk-renorm", "softmax-topk", "topk-softmax")


def gate_weights(kind: str, logits: torch.Tensor, indices: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The ``[N, k]`` gate weights of gate function ``kind`` at ``indices`` from ``logits [N, E]``."""
    if kind == "topk-softmax":
        return torch.softmax(logits.gather(-1, indices), dim=-1, dtype=logits.dtype).to(out_dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights = probs.gather(-1, indices)
    if kind == "softmax-topk-renorm":
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(out_dtype)


def detect_gate(info: RouterInfo, logits: torch.Tensor, scores: torch.Tensor, indices: torch.Tensor) -> str:
    """The gate function that reproduces this router's own scores from its logits and indices."""
    with torch.no_grad():
        logits2d = logits.reshape(-1, logits.shape[-1])
        # in bf16 two gate functions can round to the same scores on one batch: try the model's own first
        norm = getattr(info.module, "norm_topk_prob", None)
        preferred = (
            "softmax-topk" if norm is False else "topk-softmax" if "GptOss" in type(info.module).__name__ else None
        )
        order = list(GATE_FUNCTIONS)
        if preferred is not None:
            order.remove(preferred)
            order.insert(0, preferred)
        candidates = {kind: gate_weights(kind, logits2d, indices.long(), scores.dtype) for kind in order}
        for kind in order:
            if torch.equal(candidates[kind], scores.reshape(candidates[kind].shape)):
                return kind
        tol = dict(rtol=1e-3, atol=1e-5) if scores.dtype == torch.float32 else dict(rtol=2e-2, atol=1e-3)
        for kind in order:
            if torch.allclose(candidates[kind].float(), scores.reshape(candidates[kind].shape).float(), **tol):
                return kind
    raise RoutingError(
        f"router {info.name} ({type(info.module).__name__}) computes its gate weights with none of "
        f"{GATE_FUNCTIONS} (e.g. a sigmoid or bias-corrected router); Routing Replay cannot reproduce it"
    )
