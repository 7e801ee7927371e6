"""Small tensor helpers shared by the components (private)."""

from __future__ import annotations

import torch

#: the largest |log weight| a train-inference correction exponentiates: exp(20) ~ 4.9e8 lies beyond every
#: threshold such a weight is compared with, and exp stays finite in float32 (it overflows past ~88)
MAX_LOG_WEIGHT = 20.0


def masked(values: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``values`` where ``mask`` is set, ``fill`` elsewhere.

    Uses ``torch.where`` rather than multiplication so that non-finite values at padding (for example
    ``-inf`` log-probs) neither leak into the result nor into its gradient.
    """
    return torch.where(mask > 0, values, torch.full_like(values, fill))


def float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The first floating dtype among ``tensors``, else torch's default float dtype."""
    for t in tensors:
        if t.is_floating_point():
            return t.dtype
    return torch.get_default_dtype()


def group_normalise(
    values: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_normalize: bool,
    unbiased_std: bool,
    eps: float,
) -> torch.Tensor:
    """``(v - mean_g v) / (std_g v + eps)`` (or ``v - mean_g v`` without std), per group of equal ``group_ids``.

    Computed in float64. A group of one member, or whose values are all equal, gets exactly 0 (also with
    ``eps = 0``, where the division would otherwise be 0/0).
    """
    v = values.to(torch.float64).reshape(-1)
    if v.numel() == 0:
        return v
    _, inverse = torch.unique(group_ids.reshape(-1).cpu(), return_inverse=True)
    inverse = inverse.to(v.device)
    counts = torch.bincount(inverse).to(torch.float64)
    sums = torch.zeros_like(counts).index_add_(0, inverse, v)
    highs = torch.full_like(counts, -torch.inf).scatter_reduce_(0, inverse, v, reduce="amax")
    lows = torch.full_like(counts, torch.inf).scatter_reduce_(0, inverse, v, reduce="amin")
    centred = v - (sums / counts)[inverse]
    if std_normalize:
        sq = torch.zeros_like(counts).index_add_(0, inverse, centred * centred)
        dof = counts - 1.0 if unbiased_std else counts
        std = torch.sqrt(sq / dof.clamp(min=1.0))
        centred = centred / (std[inverse] + eps)
    constant = (counts[inverse] < 2) | (highs[inverse] == lows[inverse])
    return torch.where(constant, torch.zeros_like(centred), centred)


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``c_t = (A_t - mean A) * (logp_t - mean logp)`` per token, means over the valid tokens (Cui et al. 2025).

    The centred product whose batch mean is the covariance driving the policy's entropy change. No gradient;
    0 at masked positions.
    """
    keep = mask > 0
    count = keep.sum().clamp(min=1).to(logp.dtype)
    adv = masked(advantages.detach(), mask)
    lp = masked(logp.detach(), mask)
    centred = (adv - adv.sum() / count) * (lp - lp.sum() / count)
    return masked(centred, mask)


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(v - mu) / sqrt(var + 1e-8)`` over the valid tokens of the whole batch (verl's ``masked_whiten``).

    ``mu = sum m v / N`` and ``var = sum m (v - mu)^2 / (N - 1)`` (unbiased), ``N`` the number of valid tokens.
    verl divides its means by ``N + 1e-8``, a relative difference below 1e-8 except that it turns a constant
    batch into ``~1e-5 * v`` instead of 0. With fewer than two valid tokens there is no spread and no signal:
    the result is 0. Computed in float64; 0 at masked positions.
    """
    v = masked(values.to(torch.float64), mask)
    n = (mask > 0).sum().to(torch.float64)
    if n < 2:
        return torch.zeros_like(v)
    centred = masked(v - v.sum() / n, mask)
    var = (centred * centred).sum() / (n - 1.0)
    return masked(centred * torch.rsqrt(var + 1e-8), mask)


def token_fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the valid tokens where ``flags`` is set (0 without valid tokens)."""
    keep = mask > 0
    return float((flags & keep).sum()) / max(int(keep.sum()), 1)


def response_fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the responses (rows with at least one valid token) with ``flags`` set at a valid token."""
    keep = mask > 0
    responses = keep.any(dim=-1)
    return float((flags & keep).any(dim=-1)[responses].sum()) / max(int(responses.sum()), 1)
