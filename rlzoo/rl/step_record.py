"""One RL step's record: what each phase of :func:`rlzoo.rl.loop.rl_step` adds, read by the phases after it.

    rollout      <- the schedule's rollout batch: samples, rewards, the rollout engine's log-probs
    old          <- the old pass: old / train / rollout / reference log-probs, entropy, correction weights
    token_stats  <- the statistics the advantage source declares (``needs_token_stats``), from the same pass
    teacher_logp <- the teacher's log-probs (on-policy distillation)
    values       <- the critic's values
    advantages, returns, advantage_metrics <- the advantage source (and the KL-in-reward penalty)
    loss_mask    <- the response mask less the tokens the correction rejects
    updates, critic_updates <- each minibatch's metrics
    reports      <- what components report in the old pass and the train phase (each a scope into this dict,
                    ``collecting(into=record.reports)``, :func:`rlzoo.interfaces.base.collecting`) outside the
                    narrower scopes of the learner's passes, each minibatch's update and the objective's call;
                    a later report of the same key in the step keeps the last value

Like torchtune's ``GRPOTrajectory`` (``recipes/dev/grpo_full_finetune_distributed.py``) and the one ``inputs`` dict
of TRL's ``_generate_and_score_completions``: the step's data travels in one object from generation to the loss,
so a phase's function takes the record and the components, not the loose tensors of the phases before it. A field
is ``None`` until its phase ran (or when the run has no such phase: no teacher, no critic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from torch import Tensor

from rlzoo.engines import TokenBatch
from rlzoo.rl.rollouts import RolloutBatch
from rlzoo.util.timer import Timer

T = TypeVar("T")


@dataclass
class OldLogprobs:
    """The rollout batch's log-probs before the step's updates, and the train-inference correction from them."""

    logp: Tensor  # the ratio's denominator (algorithm.old_logprobs): the training engine's or the rollout engine's
    train: Tensor | None  # the training engine's pass; None: rollout-only skips it
    entropy: Tensor | None  # the policy's entropy from that pass
    rollout: Tensor  # the rollout engine's
    reference: Tensor | None  # the KL reference's, if there is one
    correction: Tensor  # the mismatch correction's weights (e.g. TIS)


@dataclass
class StepRecord:
    """What one RL step has computed so far, phase by phase (module docstring)."""

    step: int
    timer: Timer = field(default_factory=Timer)  # each phase's wall-clock time (time/<phase>)
    rollout: RolloutBatch | None = None
    old: OldLogprobs | None = None
    token_stats: dict[str, Tensor] = field(default_factory=dict)  # [B, T] each, by name (needs_token_stats)
    teacher_logp: Tensor | None = None
    values: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    advantage_metrics: dict[str, float] = field(default_factory=dict)
    loss_mask: Tensor | None = None
    updates: list[dict[str, float]] = field(default_factory=list)
    critic_updates: list[dict[str, float]] = field(default_factory=list)
    reports: dict[str, float] = field(default_factory=dict)

    @property
    def batch(self) -> TokenBatch | None:
        """The rollout batch's tokens; ``None`` when the batch filter kept no group (nothing to train on)."""
        return self.rollout.batch if self.rollout is not None else None


def filled(value: T | None, name: str) -> T:
    """``value``, a field of the step record (``name``) that an earlier phase fills, for a phase that reads it: a
    ``None`` there means the phases ran out of order (or the run lacks the component that fills it), not data."""
    if value is None:
        raise RuntimeError(f"step record: {name} is read before the phase that fills it ran")
    return value
