"""GDPO advantage (Group reward-Decoupled normalisation Policy Optimization, arXiv:2601.05242): each named part of
the reward is normalised within its group on its own, then the parts are weighted and summed, then whitened.

    A^k_i = (r^k_i - mean_{j in g(i)} r^k_j) / (std_{j in g(i)} r^k_j + eps)      per part k (GRPO's normalisation)
    A_i   = sum_k w_k A^k_i,           broadcast to the tokens of y_i, then whitened over the batch's valid tokens

so a part with a large spread (a dense length penalty) does not drown a sparse one (correctness), as it does when
the parts are summed first. The parts are the verdicts' (:attr:`Verdict.parts`, e.g. ``weighted``'s one part per
verifier it combines) plus ``shaping`` / ``turns`` when the run has reward shapers / turn rewards
(``RewardBatch.reward_parts``); ``parts`` picks some (verl: ``gdpo_reward_keys``), ``weights`` weighs them (verl:
``gdpo_reward_weights``; 1 for a part it does not name). The std is unbiased (N-1); without ``std_normalize`` only
the group mean is taken off. As verl's ``compute_gdpo_outcome_advantage``, except for a group of one response,
whose part advantages are 0 here (verl divides the raw part by 1 + eps there); a run with ``rollout.group_size:
1``, where every response is alone, is refused before it starts (``needs_groups``). A verifier that returns no
parts is refused before the run when it declares so (:meth:`Verifier.reward_parts`), else at the first step.
"""

from __future__ import annotations

import torch
from pydantic import Field, ValidationInfo, field_validator

import rlzoo
from rlzoo.errors import RlzooError
from rlzoo.interfaces import AdvantageSource, Params, Problem, RewardBatch, RunFacts
from rlzoo_estimators._util import float_dtype, group_normalise, whiten

#: the parts a run adds beside the verifier's: the reward shapers' terms and an environment's turn rewards
RUN_PARTS = ("shaping", "turns")


@rlzoo.register("advantage", "gdpo")
class GDPOAdvantage(AdvantageSource):
    """GDPO: each reward part group-normalised on its own, weighted, summed, whitened over the batch."""

    formula = "A_i = whiten(sum_k w_k (r^k_i - mean_group r^k) / (std_group r^k + eps)) over the reward parts k"
    reference = "GDPO (Group reward-Decoupled Normalization Policy Optimization, arXiv:2601.05242)"
    needs_groups = True
    verl_name = "adv_estimator=gdpo"
    needs_reward_parts = True

    class Params(Params):
        parts: list[str] | None = Field(
            None, min_length=1, description="the reward parts to use (verl: gdpo_reward_keys); null: every part"
        )
        weights: dict[str, float] | None = Field(
            None, description="weight per part name (verl: gdpo_reward_weights); a part not named weighs 1"
        )
        std_normalize: bool = Field(
            True, description="divide each part by its group std (verl: norm_adv_by_std_in_grpo)"
        )
        eps: float = Field(1e-6, ge=0.0, description="added to the std before dividing")

        @field_validator("weights")
        @classmethod
        def _weights_name_chosen_parts(cls, weights: dict[str, float] | None, info: ValidationInfo):
            parts = info.data.get("parts")
            unknown = sorted(set(weights or {}) - set(parts)) if parts is not None else []
            if unknown:
                raise ValueError(f"names {unknown[0]!r}, which is not in parts ({', '.join(parts)})")
            return weights

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        problems = super().preflight(run, at)
        verifier = run.components.get("verifier")
        declared = verifier.reward_parts() if verifier is not None else None
        if declared:  # (): the base class's problem; None: checked when scored
            named = [(f"{at}.parts.{index}", part) for index, part in enumerate(self.params.parts or [])]
            # with parts set, weights may name only those (Params); without, the verifier's parts are all there is
            named += [(f"{at}.weights.{part}", part) for part in self.params.weights or {}]
            for loc, part in named:
                if part not in declared and part not in RUN_PARTS:  # the run's own parts are checked when scored
                    problems.append(
                        (
                            loc,
                            f"{part!r} is not a reward part of verifier {verifier.name!r}; its parts: {', '.join(declared)}",
                        )
                    )
        return problems

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        if not batch.reward_parts:
            raise RlzooError(
                "verifier: its verdicts carry no reward parts (Verdict.parts), but advantage 'gdpo' "
                "(algorithm.advantage) normalises each part on its own: use a verifier that returns named parts "
                "(weighted: one part per verifier it combines), or an advantage that reads the reward alone (group, ...)"
            )
        names = self.params.parts or sorted(batch.reward_parts)
        missing = [name for name in names if name not in batch.reward_parts]
        if missing:
            raise RlzooError(
                f"algorithm.advantage.parts: {missing[0]!r} is not among the verdicts' reward parts "
                f"({', '.join(sorted(batch.reward_parts))})"
            )
        weights = self.params.weights or {}
        unused = sorted(set(weights) - set(batch.reward_parts))
        if unused:  # a weight that would weigh nothing: a misspelt part (a declaring verifier's is refused earlier)
            raise RlzooError(
                f"algorithm.advantage.weights: {unused[0]!r} is not among the verdicts' reward parts "
                f"({', '.join(sorted(batch.reward_parts))})"
            )
        total = torch.zeros(batch.mask.shape[0], dtype=torch.float64, device=batch.mask.device)
        for name in names:
            normalised = group_normalise(
                batch.reward_parts[name],
                batch.group_index,
                std_normalize=self.params.std_normalize,
                unbiased_std=True,
                eps=self.params.eps,
            )
            total = total + weights.get(name, 1.0) * normalised.to(total.device)
        per_token = total.unsqueeze(-1).expand(batch.mask.shape)
        return whiten(per_token, batch.mask).to(float_dtype(batch.rewards, batch.mask))
