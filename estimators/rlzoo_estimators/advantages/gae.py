"""GAE advantage (Schulman et al. 2016) from the critic's values, with holes in a response skipped (multi-turn).

Over the valid tokens t_1 < t_2 < ... < t_n of a response (positions where the mask is 1; observation tokens
inside a multi-turn response and padding are passed over as if removed):

    delta_k = r_{t_k} + gamma * V_{t_{k+1}} - V_{t_k}            (V_{t_{n+1}} = 0)
    A_{t_k} = delta_k + gamma * lam * A_{t_{k+1}}                 (A_{t_{n+1}} = 0)
    R_{t_k} = A_{t_k} + V_{t_k}                                   (the critic's targets: raw A, before whitening)
    A      <- whiten(A) over all valid tokens of the batch       (whiten = true: (A - mu) / sqrt(var + 1e-8))

``r`` is ``RewardBatch.token_rewards`` (rewards at masked positions are ignored) and ``V`` is
``RewardBatch.values``. As verl 0.9.1's ``compute_gae_advantage_return`` at every valid token; advantages and
returns are 0 at masked positions (verl leaves the next valid token's advantage in a hole and whitens the padding
too). With fewer than two valid tokens in the batch, where verl's whitening raises, the whitened advantages are 0.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, masked, whiten


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Raw (unwhitened) ``[B, T]`` GAE advantages in float64, each row's masked positions skipped; 0 there."""
    keep = mask > 0
    # move each row's valid tokens to its front, in order: the holes vanish and the recursion runs on a prefix
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)  # [B, T]
    kept = keep.gather(-1, order)  # [B, T], a prefix of True per row
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    r = torch.where(kept, token_rewards.detach().to(torch.float64).gather(-1, order), zero)
    v = torch.where(kept, values.detach().to(torch.float64).gather(-1, order), zero)
    v_next = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=-1)  # 0 after a row's last valid token
    delta = torch.where(kept, r + gamma * v_next - v, zero)  # [B, T]
    compact = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for k in reversed(range(int(kept.sum(-1).max().item()) if kept.numel() else 0)):
        running = delta[:, k] + gamma * lam * running
        compact[:, k] = running
    # back to the original positions; the masked ones receive the 0s that follow each row's valid prefix
    return torch.zeros_like(compact).scatter(-1, order, compact)


@rlzoo.register("advantage", "gae")
class GAEAdvantage(AdvantageSource):
    """GAE: lambda-weighted TD errors of the critic's values, whitened over the batch; returns A + V for the critic.

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}`` over valid tokens only.
    """

    formula = "A_t = sum_k (gamma lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t; whitened; R = A + V"
    reference = "GAE (Schulman et al. 2016, arXiv:1506.02438); PPO-RLHF (Ouyang et al. 2022)"
    verl_name = "adv_estimator=gae"
    needs_values = True
    reads_token_rewards = True

    class Params(Params):
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per later valid token")
        lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda: 0 is the one-step TD error, 1 the MC return")
        whiten: bool = Field(
            True, description="whiten the advantages over the batch's valid tokens (verl always does); false: raw GAE"
        )

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        return self.advantages_and_returns(batch)[0]

    def advantages_and_returns(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        batch.require(self.name, "the per-token rewards and the critic's values", "token_rewards", "values")
        p = self.params
        raw = gae(batch.token_rewards, batch.values, batch.mask, p.gamma, p.lam)
        returns = masked(raw + batch.values.detach().to(torch.float64), batch.mask)
        advantages = whiten(raw, batch.mask) if p.whiten else raw
        dtype = float_dtype(batch.token_rewards, batch.values)
        return advantages.to(dtype), returns.to(dtype)
