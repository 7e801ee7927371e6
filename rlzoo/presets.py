"""Algorithm presets: named component combinations. Any field of a preset can be overridden in the config.

See docs/presets.md for each preset's source. A preset is a plain dict in the config's own schema.
"""

from __future__ import annotations

import copy
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath (Shao et al. 2024): token ratio, symmetric clip 0.2, group-normalised advantage,
    # per-sequence mean of token means, k3 KL to the reference with beta 0.04.
    "grpo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.04,
    },
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std normalisation, no length
    # normalisation (constant normaliser), no KL.
    "dr-grpo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": False},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "seq-mean-token-sum-norm"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), token-level loss, dynamic sampling (only groups whose
    # rewards differ, resampling up to 10 generation batches as verl's recipe), soft overlong punishment over the
    # last fifth of the response budget (the paper's 4096 of 20480 tokens, penalty 1.0), no KL.
    "dapo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.28},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
        "batch_filter": {"name": "dynamic-sampling", "max_gen_batches": 10},
        "reward_shaping": [{"name": "overlong", "penalty": 1.0}],
    },
    # GSPO (Zheng et al. 2025): length-normalised sequence ratio, tiny clip range (3e-4 / 4e-4), no KL.
    "gspo": {
        "ratio": {"name": "sequence"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "ppo", "eps_low": 3e-4, "eps_high": 4e-4},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # GSPO-token (same paper, §4.3): sequence ratio value with per-token gradients, for per-token advantages.
    "gspo-token": {
        "ratio": {"name": "sequence-token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "ppo", "eps_low": 3e-4, "eps_high": 4e-4},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # RLOO (Ahmadian et al. 2024, "Back to Basics"; TRL's RLOOTrainer): leave-one-out baseline, PPO clip 0.2.
    "rloo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "rloo"},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # CISPO (MiniMax-M1, 2025): the importance weight is truncated (1 - 1.0 .. 1 + 4.0) but every token keeps its
    # gradient; token-level loss as in the paper and verl's recipe; no KL.
    "cispo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "cispo", "eps_low": 1.0, "eps_high": 4.0},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # SAPO (Gao et al. 2025): a sigmoid gate (tau 1.0 / 1.05) instead of a hard clip; verl always aggregates it
    # seq-mean-token-mean; no KL.
    "sapo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # GMPO (Zhao et al. 2025): geometric mean of token ratios clipped in log space (0.4 / 0.4), one loss per
    # response averaged over responses; no KL.
    "gmpo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "gmpo", "eps_low": 0.4, "eps_high": 0.4},
        "aggregation": {"name": "seq-mean-token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # GPG (Chu et al. 2025): no ratio, no clip, the plain policy gradient with GPG's rescaled group advantage;
    # one gradient step per rollout batch, since nothing corrects for off-policy minibatches.
    "gpg": {
        "ratio": {"name": "gpg"},
        "advantage": {"name": "gpg"},
        "clipper": {"name": "none"},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
        "minibatches_per_rollout": 1,
    },
    # REINFORCE++ (Hu 2025): the outcome return whitened over the whole batch (no per-prompt group), PPO clip 0.2,
    # token-level loss.
    "reinforce++": {
        "ratio": {"name": "token"},
        "advantage": {"name": "reinforce++", "gamma": 1.0},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # REINFORCE++-baseline (same paper): group-mean baseline, then whitened over the batch.
    "reinforce++-baseline": {
        "ratio": {"name": "token"},
        "advantage": {"name": "reinforce++-baseline"},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # OPO (Hao et al. 2025): exactly on-policy (one gradient step per rollout batch) with the length-weighted
    # group baseline; token-level loss, no KL.
    "opo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "opo"},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
        "minibatches_per_rollout": 1,
    },
    # KL-Cov (Cui et al. 2025): no clip; a |logp - old| penalty on the 0.02% of tokens with the largest
    # advantage-logp covariance; token-level loss as in the paper's verl recipe.
    "kl-cov": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "kl-cov", "select_fraction": 0.0002, "kl_coef": 1.0},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
    # Clip-Cov (same paper): PPO clip 0.2, and 0.02% of the tokens with covariance in (1, 5) detached at random.
    "clip-cov": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {
            "name": "clip-cov", "eps_low": 0.2, "eps_high": 0.2, "select_fraction": 0.0002, "lb": 1.0, "ub": 5.0,
        },
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
    },
}


def merge_component(base: Any, override: Any) -> Any:
    """A user's component spec over a preset's: same ``name`` (or none given) merges, another name replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        if "name" in override and override["name"] != base.get("name"):
            return copy.deepcopy(override)
        return {**base, **override}
    return copy.deepcopy(override)


# Without a preset, the user's fields are merged over these, so `clipper: {eps_high: 0.3}` tunes the default ppo.
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
    """Return the algorithm section with its ``preset`` (or the defaults) expanded under the user's own fields."""
    preset_name = algorithm.get("preset")
    # an unknown preset is left for validation to report with the valid choices; expand the defaults meanwhile
    base = PRESETS.get(preset_name, DEFAULT_COMPONENTS) if preset_name is not None else DEFAULT_COMPONENTS
    merged: dict[str, Any] = copy.deepcopy(base)
    for key, value in algorithm.items():
        merged[key] = merge_component(merged[key], value) if key in merged else value
    return merged
