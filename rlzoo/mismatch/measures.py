"""The gap between two engines' log-probs of the same sampled tokens, as numbers (pure tensor arithmetic).

With ``train`` the training engine's log-probs ``log pi_train(y_t)`` of the sampled tokens, ``rollout`` the rollout
engine's ``log pi_rollout(y_t)`` and ``mask [B, T]`` the response tokens, per token::

    d_t    = train_t - rollout_t  = log r_t,   r_t = pi_train(y_t) / pi_rollout(y_t)   (the importance ratio)
    |d_t|                                       abs_logp_diff (the loop's mismatch/abs_logp_diff is its mean)
    k1_t   = rollout_t - train_t = -log r_t     k1 estimate of KL(pi_rollout || pi_train) at the rollout's samples
    k3_t   = r_t - 1 - log r_t >= 0             k3 estimate of the same KL (Schulman 2020, "Approximating KL")

and over the batch (verl 0.9.1 ``rollout_corr_helper.compute_offpolicy_metrics``; log r clamped to +-20 there)::

    chi2_token       = mean_t r_t^2 - 1                                 chi-squared divergence, token level
    chi2_seq         = mean_i exp(2 sum_t m_t log r_t) - 1              the same, one ratio per response
    log_ppl_abs_diff = mean_i | mean_t rollout_t - mean_t train_t |     per response (the log of the ppl ratio)
    ess_token        = (sum_t r_t)^2 / (n sum_t r_t^2)                  effective sample size of the exact
                                                                        token ratios, as a share of n (1: no gap)

``share_above_<x>`` is the share of response tokens with ``|d_t| > x``. :func:`by_position` and
:func:`by_probability` break ``|d_t|`` down by the token's place in the response and by ``pi_rollout(y_t)``.
"""

from __future__ import annotations

import math

import torch

MAX_LOG_RATIO = 20.0  # verl's SAFETY_BOUND: log r clamped before exp
THRESHOLDS = (0.1, 0.5, 1.0)  # |d_t| bounds whose exceedance share is reported
PROBABILITY_EDGES = (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0)  # bins of pi_rollout(y_t)
MAX_POSITION_BINS = 8


def threshold_name(x: float) -> str:
    return f"share_above_{x:g}"


def gap_metrics(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The module docstring's batch numbers of ``[B, T]`` log-probs over ``mask``; ``{}`` when no token counts."""
    valid = mask > 0
    if not bool(valid.any()):
        return {}
    d = torch.where(valid, train.double() - rollout.double(), torch.zeros((), dtype=torch.float64))
    log_r = d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    r = torch.exp(log_r)
    tokens = d[valid]
    absd = tokens.abs()
    k3 = (r - 1 - log_r)[valid]
    rows = valid.any(dim=-1)
    counts = valid.sum(dim=-1).clamp(min=1)
    seq_log_r = log_r.sum(dim=-1)[rows]
    rollout_mean = torch.where(valid, rollout.double(), 0.0).sum(-1)[rows] / counts[rows]
    train_mean = torch.where(valid, train.double(), 0.0).sum(-1)[rows] / counts[rows]
    rv = r[valid]
    out = {
        "abs_logp_diff": absd.mean().item(),
        "abs_logp_diff_max": absd.max().item(),
        "abs_logp_diff_p50": absd.quantile(0.5).item(),
        "abs_logp_diff_p99": absd.quantile(0.99).item(),
        "k1_kl": (-tokens).mean().item(),
        "k3_kl": k3.mean().item(),
        "chi2_token": (rv.square().mean() - 1).item(),
        "chi2_seq": (torch.exp(2 * seq_log_r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).mean() - 1).item(),
        "log_ppl_abs_diff": (rollout_mean - train_mean).abs().mean().item(),
        "ess_token": ess(rv),
        "tokens": float(valid.sum()),
        "responses": float(rows.sum()),
    }
    out.update({threshold_name(x): (absd > x).double().mean().item() for x in THRESHOLDS})
    return out


def ess(weights: torch.Tensor) -> float:
    """Effective sample size of ``weights`` (one per sample) as a share of their number: ``(sum w)^2 / (n sum w^2)``
    (Kong 1992; verl's ``rollout_is_eff_sample_size``, ``1 / mean((w / mean w)^2)``); 1 for equal weights, 0 when
    every weight is 0."""
    w = weights.double().flatten()
    square = w.square().sum()
    if w.numel() == 0 or square.item() == 0:
        return 0.0
    return (w.sum().square() / (w.numel() * square)).item()


def position_edges(width: int) -> list[int]:
    """Bin edges over response positions ``0..width``: one bin per position up to :data:`MAX_POSITION_BINS`, else
    that many bins of (nearly) equal width."""
    bins = min(max(width, 1), MAX_POSITION_BINS)
    return sorted({round(i * width / bins) for i in range(bins + 1)})


def _binned(values: torch.Tensor, keys: torch.Tensor, edges: list[float], labels: list[str]) -> list[dict]:
    rows = []
    total = max(values.numel(), 1)
    for i, label in enumerate(labels):
        low, high = edges[i], edges[i + 1]
        last = i == len(labels) - 1
        inside = (keys >= low) & ((keys <= high) if last else (keys < high))
        picked = values[inside]
        rows.append(
            {
                "bin": label,
                "tokens": int(picked.numel()),
                "share": picked.numel() / total,
                "abs_logp_diff": picked.mean().item() if picked.numel() else math.nan,
                "abs_logp_diff_max": picked.max().item() if picked.numel() else math.nan,
            }
        )
    return rows


def by_position(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """Mean and max ``|d_t|`` per bin of response position ``t`` (0 = the first response token)."""
    valid = mask > 0
    positions = torch.arange(mask.shape[-1]).expand_as(mask)[valid].double()
    absd = (train.double() - rollout.double())[valid].abs()
    edges = position_edges(mask.shape[-1])
    labels = [f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:], strict=False)]
    return _binned(absd, positions, [float(e) - 0.5 for e in edges], labels)


def by_probability(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """Mean and max ``|d_t|`` per bin of the rollout engine's probability of the sampled token."""
    valid = mask > 0
    p = torch.exp(rollout.double())[valid]
    absd = (train.double() - rollout.double())[valid].abs()
    edges = list(PROBABILITY_EDGES)
    labels = [
        f"[{lo:g}, {hi:g}{']' if i == len(edges) - 2 else ')'}"
        for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False))
    ]
    return _binned(absd, p, edges, labels)
