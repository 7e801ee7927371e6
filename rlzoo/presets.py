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
    # DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), token-level loss, no KL.
    "dapo": {
        "ratio": {"name": "token"},
        "advantage": {"name": "group", "std_normalize": True},
        "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.28},
        "aggregation": {"name": "token-mean"},
        "kl": {"name": "k3"},
        "kl_coef": 0.0,
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
