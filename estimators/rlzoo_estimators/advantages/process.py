"""Process (per-step) advantage: per-token advantages from step-level rewards (DeepSeekMath §4.1.3).

All step rewards of one group (every step of every response to the same prompt) are normalised together,

    r~_{i,k} = (r_{i,k} - mean_g r) / (std_g r + eps)        (or r - mean_g r with std_normalize = false)

and token t of response i, which lies in step k(t), gets the sum of the normalised rewards of that step and
every later one:

    A_{i,t} = sum_{k' >= k(t)} r~_{i,k'}

Step k covers the response tokens ``[step_ends[k-1], step_ends[k])`` (the first starts at 0). Token indices
count response tokens, i.e. the positions where the mask is 1, in order. Tokens after the last step get 0.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, group_normalise, masked


@rlzoo.register("advantage", "process")
class ProcessAdvantage(AdvantageSource):
    """Per-token advantage from per-step rewards: suffix sum of group-normalised step rewards.

    ``A_{i,t} = sum_{k >= step(t)} (r_{i,k} - mean_g r) / (std_g r + eps)``; needs a process verifier.
    """

    formula = "A_it = sum_{k >= step(t)} group-normalised step rewards"
    reference = "DeepSeekMath process supervision (Shao et al. 2024, §4.1.3)"
    needs_step_rewards = True

    class Params(Params):
        std_normalize: bool = Field(True, description="divide by the std of the group's step rewards")
        unbiased_std: bool = Field(True, description="unbiased (N-1) std; false: biased (N)")
        eps: float = Field(1e-6, ge=0.0, description="added to the std before dividing")

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        step_rewards, step_ends = batch.step_rewards, batch.step_ends
        if step_rewards is None:
            raise ValueError(
                "advantage 'process' needs per-step rewards (RewardBatch.step_rewards is None); "
                "use a process verifier, or an outcome advantage such as 'group'"
            )
        if step_ends is None:
            raise ValueError("advantage 'process' needs RewardBatch.step_ends alongside step_rewards")
        mask = batch.mask
        batch_size = mask.shape[0]
        if len(step_rewards) != batch_size or len(step_ends) != batch_size:
            raise ValueError(
                f"advantage 'process': got {len(step_rewards)} step_rewards and {len(step_ends)} step_ends "
                f"lists for a batch of {batch_size} responses"
            )
        for i, (rewards_i, ends_i) in enumerate(zip(step_rewards, step_ends, strict=True)):
            if len(rewards_i) != len(ends_i):
                raise ValueError(
                    f"advantage 'process': response {i} has {len(rewards_i)} step rewards but {len(ends_i)} step ends"
                )
            if any(b < a for a, b in zip(ends_i, ends_i[1:])) or any(e < 0 for e in ends_i):
                raise ValueError(f"advantage 'process': step_ends of response {i} must be non-negative and sorted")

        # normalise every step reward of a group together
        owners = [i for i, rewards_i in enumerate(step_rewards) for _ in rewards_i]
        flat = torch.tensor([r for rewards_i in step_rewards for r in rewards_i], dtype=torch.float64)
        groups = batch.group_index.reshape(-1).cpu()[torch.tensor(owners, dtype=torch.long)]
        normalised = group_normalise(
            flat,
            groups,
            std_normalize=self.params.std_normalize,
            unbiased_std=self.params.unbiased_std,
            eps=self.params.eps,
        )

        # token -> its step (by response-token index) -> suffix sum of normalised step rewards
        bool_mask = (mask > 0).cpu()
        token_index = torch.cumsum(bool_mask.to(torch.long), dim=-1) - 1
        adv = torch.zeros(mask.shape, dtype=torch.float64)
        offset = 0
        for i, ends_i in enumerate(step_ends):
            n_steps = len(ends_i)
            if n_steps == 0:
                continue
            norm_i = normalised[offset : offset + n_steps]
            offset += n_steps
            # suffix[k] = sum_{k' >= k} norm_i[k']; one extra 0 for tokens after the last step
            suffix = torch.cat([norm_i.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.float64)])
            ends = torch.tensor(ends_i, dtype=torch.long)
            step_of_token = torch.searchsorted(ends, token_index[i], right=True)  # first k with end_k > t
            adv[i] = suffix[step_of_token.clamp(max=n_steps)]
        dtype = float_dtype(batch.rewards, mask)
        return masked(adv.to(device=mask.device, dtype=dtype), mask)
