"""Algorithm presets: named component combinations. Any field of a preset can be overridden in the config.

See docs/presets.md for each preset's source. A preset is a plain dict in the config's own schema.
"""

from __future__ import annotations

import copy
from typing import Any

# Each preset states only what differs from the components' defaults (DEFAULT_COMPONENTS below, each component's
# own parameter defaults, rlzoo.config.algorithm.AlgorithmConfig's fields); what it leaves out is that default. The
# comments say what each source specifies, including the parts that are defaults.
PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath (Shao et al. 2024): token ratio, symmetric clip 0.2, group-normalised advantage,
    # per-sequence mean of token means, k3 KL to the reference with beta 0.04.
    "grpo": {"kl_coef": 0.04},
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std normalisation, no length
    # normalisation (constant normaliser), no KL.
    "dr-grpo": {"advantage": {"std_normalize": False}, "aggregation": {"name": "seq-mean-token-sum-norm"}},
    # DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), token-level loss, dynamic sampling (only groups whose
    # rewards differ, resampling up to 10 generation batches as verl's recipe), soft overlong punishment over the
    # last fifth of the response budget (the paper's 4096 of 20480 tokens, penalty 1.0), no KL.
    "dapo": {
        "clipper": {"eps_high": 0.28},
        "aggregation": {"name": "token-mean"},
        "batch_filter": {"name": "dynamic-sampling"},
        "reward_shaping": [{"name": "overlong"}],
    },
    # GSPO (Zheng et al. 2025): length-normalised sequence ratio, tiny clip range (3e-4 / 4e-4), no KL.
    "gspo": {"ratio": {"name": "sequence"}, "clipper": {"eps_low": 3e-4, "eps_high": 4e-4}},
    # GSPO-token (same paper, §4.3): sequence ratio value with per-token gradients, for per-token advantages.
    "gspo-token": {"ratio": {"name": "sequence-token"}, "clipper": {"eps_low": 3e-4, "eps_high": 4e-4}},
    # RLOO (Ahmadian et al. 2024, "Back to Basics"; TRL's RLOOTrainer): leave-one-out baseline, PPO clip 0.2.
    "rloo": {"advantage": {"name": "rloo"}},
    # CISPO (MiniMax-M1, 2025): the importance weight is truncated (1 - 1.0 .. 1 + 4.0) but every token keeps its
    # gradient; token-level loss as in the paper and verl's recipe; no KL.
    "cispo": {"clipper": {"name": "cispo"}, "aggregation": {"name": "token-mean"}},
    # SAPO (Gao et al. 2025): a sigmoid gate (tau 1.0 / 1.05) instead of a hard clip; verl always aggregates it
    # seq-mean-token-mean (the default aggregation); no KL.
    "sapo": {"clipper": {"name": "sapo"}},
    # GMPO (Zhao et al. 2025): geometric mean of token ratios clipped in log space (0.4 / 0.4), one loss per
    # response averaged over responses; no KL.
    "gmpo": {"clipper": {"name": "gmpo"}},
    # GPG (Chu et al. 2025): no ratio, no clip, the plain policy gradient with GPG's rescaled group advantage;
    # one gradient step per rollout batch, since nothing corrects for off-policy minibatches.
    "gpg": {
        "ratio": {"name": "gpg"},
        "advantage": {"name": "gpg"},
        "clipper": {"name": "none"},
        "aggregation": {"name": "token-mean"},
        "minibatches_per_rollout": 1,
    },
    # REINFORCE++ (Hu 2025): the outcome return (gamma 1) whitened over the whole batch (no per-prompt group), PPO
    # clip 0.2, token-level loss.
    "reinforce++": {"advantage": {"name": "reinforce++"}, "aggregation": {"name": "token-mean"}},
    # REINFORCE++-baseline (same paper): group-mean baseline, then whitened over the batch.
    "reinforce++-baseline": {"advantage": {"name": "reinforce++-baseline"}, "aggregation": {"name": "token-mean"}},
    # OPO (Hao et al. 2025): exactly on-policy (one gradient step per rollout batch) with the length-weighted
    # group baseline; token-level loss, no KL.
    "opo": {"advantage": {"name": "opo"}, "aggregation": {"name": "token-mean"}, "minibatches_per_rollout": 1},
    # PPO for LLMs (Ouyang et al. 2022; verl's PPO recipe): a learned critic (the policy's initial weights with a
    # value head, clipped value loss 0.5), GAE advantages (gamma = lambda = 1, whitened), PPO clip 0.2, token-level
    # loss, and the reference KL in the reward (k1, verl's kl_penalty "kl", fixed coefficient 0.001) instead of a
    # KL loss term.
    "ppo": {
        "advantage": {"name": "gae"},
        "critic": {},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k1"},
        "kl_in_reward": {"name": "fixed"},
    },
    # KL-Cov (Cui et al. 2025): no clip; a |logp - old| penalty (coefficient 1) on the 0.02% of tokens with the
    # largest advantage-logp covariance; token-level loss as in the paper's verl recipe.
    "kl-cov": {"clipper": {"name": "kl-cov"}, "aggregation": {"name": "token-mean"}},
    # Clip-Cov (same paper): PPO clip 0.2, and 0.02% of the tokens with covariance in (1, 5) detached at random.
    "clip-cov": {"clipper": {"name": "clip-cov"}, "aggregation": {"name": "token-mean"}},
    # DPPO (arXiv:2602.04879; verl's recipe run_dppo): a trust region on the sampled token's probability (TV 0.15 /
    # KL 0.05), Dr.GRPO's advantage and aggregation, the rollout engine's log-probs as the old ones (bypass mode).
    "dppo-tv": {
        "clipper": {"name": "dppo-tv"},
        "advantage": {"std_normalize": False},
        "aggregation": {"name": "seq-mean-token-sum-norm"},
        "old_logprobs": "rollout",
    },
    "dppo-kl": {
        "clipper": {"name": "dppo-kl"},
        "advantage": {"std_normalize": False},
        "aggregation": {"name": "seq-mean-token-sum-norm"},
        "old_logprobs": "rollout",
    },
    # TRL's loss_type="bnpo": PPO clip 0.2, token-level loss over the (mini)batch's tokens.
    "bnpo": {"aggregation": {"name": "token-mean"}},
    # LUSPO (arXiv:2602.05261; TRL loss_type="luspo"): GSPO whose response losses are summed over tokens, not
    # averaged (each response weighs by its length).
    "luspo": {
        "ratio": {"name": "sequence"},
        "clipper": {"eps_low": 3e-4, "eps_high": 4e-4},
        "aggregation": {"name": "seq-mean-token-sum"},
    },
    # VESPO (arXiv:2602.10693; TRL loss_type="vespo"): a Gamma-shaped weight of the sequence importance weight
    # instead of a clip (k, lambda = 2, 3 / 3, 2); token-level loss as TRL's dapo normalisation.
    "vespo": {"clipper": {"name": "vespo"}, "aggregation": {"name": "token-mean"}},
    # GDPO (arXiv:2601.05242; verl's examples/gdpo): the reward parts group-normalised one by one; verl's default
    # token-level loss.
    "gdpo": {"advantage": {"name": "gdpo"}, "aggregation": {"name": "token-mean"}},
    # ReMax (Li et al. 2023; verl's examples/remax_trainer): a greedy response's reward as the baseline, token-level
    # loss, the reference KL in the reward (k1, fixed 0.001).
    "remax": {
        "advantage": {"name": "remax"},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k1"},
        "kl_in_reward": {"name": "fixed"},
    },
}


# verl 0.9.1's rollout-correction presets (``RolloutCorrectionConfig.<name>()``) as rlzoo settings: the correction
# and, for verl's bypass mode, the old log-probs. They set no loss, so they are no algorithm presets: write one's
# fields beside any ``preset:`` (docs/components/correction.md). Left out: verl's bypass_pg_* presets, whose
# REINFORCE loss is a policy loss, not a correction. estimators/tests/test_estimators_rollout_corr.py checks each
# against verl's own output.
_GEO_RS = {"statistic": "k1", "level": "seq_mean", "low": 0.999, "high": 1.001}  # verl's geometric rejection
_K3_RS = {"statistic": "k3", "level": "seq_mean", "high": 0.01}
ROLLOUT_CORRECTIONS: dict[str, dict[str, Any]] = {
    "decoupled_token_is": {"correction": {"name": "tis", "level": "token", "threshold": 2.0}},
    "decoupled_seq_is": {"correction": {"name": "tis", "level": "sequence", "threshold": 2.0}},
    "decoupled_token_icepop": {"correction": {"name": "icepop", "level": "token", "low": 0.5, "high": 5.0}},
    "decoupled_seq_is_rs": {
        "correction": {
            "name": "rejection",
            "criteria": [{"statistic": "k1", "level": "seq_sum", "low": 0.5, "high": 2.0}],
            "importance": {"level": "sequence", "threshold": 2.0},
        }
    },
    "decoupled_geo_rs": {"correction": {"name": "rejection", "criteria": [_GEO_RS]}},
    "decoupled_geo_rs_seq_tis": {
        "correction": {"name": "rejection", "criteria": [_GEO_RS], "importance": {"level": "sequence"}}
    },
    "decoupled_geo_rs_token_tis": {
        "correction": {"name": "rejection", "criteria": [_GEO_RS], "importance": {"level": "token"}}
    },
    "decoupled_k3_rs": {"correction": {"name": "rejection", "criteria": [_K3_RS]}},
    "decoupled_k3_rs_seq_tis": {
        "correction": {"name": "rejection", "criteria": [_K3_RS], "importance": {"level": "sequence"}}
    },
    "decoupled_k3_rs_token_tis": {
        "correction": {"name": "rejection", "criteria": [_K3_RS], "importance": {"level": "token"}}
    },
    # bypass: the rollout engine's log-probs are the old ones; without a correction the training pass is skipped
    "bypass_ppo_clip": {"old_logprobs": "rollout-only"},
    "bypass_ppo_clip_geo_rs": {"old_logprobs": "rollout", "correction": {"name": "rejection", "criteria": [_GEO_RS]}},
    "bypass_ppo_clip_k3_rs": {"old_logprobs": "rollout", "correction": {"name": "rejection", "criteria": [_K3_RS]}},
    "disabled": {"correction": {"name": "none"}},
}


def merge_component(base: Any, override: Any) -> Any:
    """A user's component spec over a preset's: same ``name`` (or none given) merges, another name replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        if "name" in override and override["name"] != base.get("name"):
            return copy.deepcopy(override)
        return {**base, **override}
    return copy.deepcopy(override)


# The base of every algorithm: a preset's and then the user's fields are merged over these, so
# `clipper: {eps_high: 0.3}` tunes the default ppo.
DEFAULT_COMPONENTS: dict[str, Any] = {
    "ratio": {"name": "token"},
    "advantage": {"name": "group"},
    "clipper": {"name": "ppo"},
    "aggregation": {"name": "seq-mean-token-mean"},
    "kl": {"name": "k3"},
    "correction": {"name": "none"},
    "batch_filter": {"name": "none"},
}


def expand_preset(algorithm: dict[str, Any]) -> dict[str, Any]:
    """The algorithm section with the defaults, then its ``preset``, then the user's own fields merged in order."""
    preset_name = algorithm.get("preset")
    # an unknown preset is left for validation to report with the valid choices; expand the defaults meanwhile
    layers = [PRESETS[preset_name], algorithm] if preset_name in PRESETS else [algorithm]
    merged: dict[str, Any] = copy.deepcopy(DEFAULT_COMPONENTS)
    for layer in layers:
        for key, value in layer.items():
            merged[key] = merge_component(merged[key], value) if key in merged else copy.deepcopy(value)
    return merged
