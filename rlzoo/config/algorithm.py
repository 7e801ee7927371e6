"""The ``algorithm`` section: the components one policy-gradient algorithm is made of, its preset, and the critic.

Each component field defaults to :data:`rlzoo.config.presets.DEFAULT_COMPONENTS`; a preset
(:func:`rlzoo.config.presets.expand_preset`) states only what differs from those.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from rlzoo.config.base import (
    DEFAULT_CRITIC_AGGREGATION,
    DEFAULT_VALUE_LOSS,
    Beta,
    LearningRate,
    Section,
    spec_class,
)
from rlzoo.config.presets import DEFAULT_COMPONENTS, PRESETS


def _default(kind: str) -> Any:
    """The default component of the algorithm field named as its ``kind``: defined once, in
    ``rlzoo.config.presets.DEFAULT_COMPONENTS``."""
    return lambda: spec_class(kind)(**DEFAULT_COMPONENTS[kind])


class CriticConfig(Section):
    """A value model trained beside the policy (PPO's critic; :mod:`rlzoo.rl.critic`, docs/critic.md). It runs on the
    run's training engine (``trainer.engine``, with the trainer's micro-batch, dtype and packing settings) with
    its own weights and optimizer, and is saved and resumed with the run."""

    model: str | None = Field(
        None,
        description="null: a copy of the policy's initial weights with a fresh scalar value head; or a folder (a "
        "Hugging Face model, e.g. a critic saved by an earlier run, whose MoE-or-dense kind matches the policy's)",
    )
    lr: LearningRate = Field(1e-4, description="the critic's AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    value_loss: spec_class("value_loss") = Field(
        default_factory=lambda: spec_class("value_loss")(name=DEFAULT_VALUE_LOSS),
        description="the regression loss onto the advantage source's returns (clipped: verl's compute_value_loss)",
    )
    aggregation: spec_class("aggregation") = Field(
        default_factory=lambda: spec_class("aggregation")(name=DEFAULT_CRITIC_AGGREGATION),
        description="how the per-token value loss is reduced (verl's critic loss_agg_mode)",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="steps at the start that train only the critic, the policy unchanged (verl's critic_warmup)",
    )


class AlgorithmConfig(Section):
    """One policy-gradient algorithm = ratio x advantage x clipper x aggregation (x KL) (x router policy)."""

    preset: str | None = None
    ratio: spec_class("ratio") = Field(default_factory=_default("ratio"))
    advantage: spec_class("advantage") = Field(default_factory=_default("advantage"))
    clipper: spec_class("clipper") = Field(default_factory=_default("clipper"))
    aggregation: spec_class("aggregation") = Field(default_factory=_default("aggregation"))
    kl: spec_class("kl") = Field(default_factory=_default("kl"))
    kl_coef: float = Field(0.0, ge=0.0, description="coefficient of the KL-to-reference loss term; 0 disables it")
    kl_bias_correction: bool = Field(
        False,
        description="multiply the per-token KL-to-reference term by the ratio w = pi_theta / pi_old (the ratio "
        "estimator's, with its gradient): the KL's gradient at samples of the old policy (TRL's "
        "use_bias_correction_kl, DeepSeek-V3.2); needs kl_coef > 0",
    )
    kl_in_reward: spec_class("kl_controller") | None = Field(
        None,
        description="the reference KL (estimator `kl`, on the old log-probs) as a per-token reward penalty, its "
        "coefficient from this controller (fixed, adaptive); null: none",
    )
    critic: CriticConfig | None = Field(
        None, description="a learned value model (needed by advantages that read values, e.g. gae); null: none"
    )
    correction: spec_class("correction") = Field(
        default_factory=_default("correction"),
        description="train-inference mismatch correction (e.g. truncated importance sampling)",
    )
    router: spec_class("router") | None = Field(None, description="MoE router policy (routing replay); null = none")
    batch_filter: spec_class("batch_filter") = Field(
        default_factory=_default("batch_filter"),
        description="which scored prompt groups a step trains on (dynamic-sampling: only informative ones)",
    )
    reward_shaping: list[spec_class("reward_shaper")] = Field(
        default_factory=list, description="terms added to the verifier's rewards, in order, before advantages"
    )
    regularisers: list[spec_class("regulariser")] = Field(
        default_factory=list, description="extra loss terms (e.g. {name: entropy, coef: 0.001})"
    )
    minibatches_per_rollout: int = Field(4, ge=1, description="gradient steps per rollout batch")
    log_ratio_clamp: float = Field(20.0, gt=0, description="log-ratios are clamped to +-this before exp")
    old_logprobs: Literal["train", "rollout", "rollout-only"] = Field(
        "train",
        description="train: recompute old log-probs with the training engine; rollout: use the rollout engine's "
        "(the training engine's pass still runs, for the mismatch metrics and corrections); rollout-only: use the "
        "rollout engine's and skip that pass (no mismatch/* or policy/entropy metrics; only with a correction that "
        "does not read it and a router policy that does not replay the old pass)",
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            import difflib

            close = difflib.get_close_matches(value, list(PRESETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown preset {value!r}{hint} Valid presets: {', '.join(PRESETS)}")
        return value

    @field_validator("kl_bias_correction")
    @classmethod
    def _kl_term_to_correct(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("kl_coef"):
            raise ValueError("true corrects the KL-to-reference loss term, which kl_coef 0 turns off: set kl_coef > 0")
        return value
