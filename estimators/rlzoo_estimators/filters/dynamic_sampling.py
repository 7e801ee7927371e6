"""Dynamic sampling (DAPO; Yu et al. 2025, arXiv:2503.14476, §3.2): train only on informative groups.

    keep group g  <=>  not all rewards r_i, i in g, are equal        (max - min > 0)

A group whose responses all got the same reward has zero group-relative advantage: it adds no gradient, only
dilutes the batch. The loop samples further generation batches of fresh prompts until ``prompts_per_step`` groups
are kept or ``max_gen_batches`` batches were generated (verl: ``filter_groups.max_num_gen_batches``).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import BatchFilter, Params


@rlzoo.register("batch_filter", "dynamic-sampling")
class DynamicSampling(BatchFilter):
    """Keep only groups whose rewards are not all equal; sample more prompts to fill the batch (DAPO)."""

    formula = "keep g iff max_{i in g} r_i > min_{i in g} r_i; resample up to max_gen_batches"
    reference = "DAPO (Yu et al. 2025, arXiv:2503.14476), dynamic sampling"
    verl_name = "algorithm.filter_groups (enable, metric, max_num_gen_batches)"
    trl_name = ""

    class Params(Params):
        max_gen_batches: int = Field(
            10, ge=1, description="most generation batches of prompts_per_step prompts sampled to fill one step"
        )

    def max_gen_batches(self) -> int:
        return self.params.max_gen_batches

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        groups = int(group_index.max()) + 1 if len(group_index) else 0
        high = torch.full((groups,), -torch.inf, dtype=rewards.dtype).scatter_reduce(0, group_index, rewards, "amax")
        low = torch.full((groups,), torch.inf, dtype=rewards.dtype).scatter_reduce(0, group_index, rewards, "amin")
        return high > low
