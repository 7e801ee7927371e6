"""The teacher of on-policy distillation: a frozen model scoring every token the policy samples.

    old logp      <- the behaviour policy's log-probs of the sampled tokens           (time/old_logprobs)
    teacher logp  <- the teacher on the same rollout batch, no gradient               (time/teacher)
    distill/reverse_kl = token-mean over policy tokens of (old logp - teacher logp)
    advantages    <- a source that reads both (needs_teacher, e.g. reverse-kl)       (time/advantage)

``distill/reverse_kl`` is the one-sample estimate of KL(student || teacher) per token from the student's own samples
(the mean of ``log p_student(y_t) - log p_teacher(y_t)`` over sampled ``y_t``): on-policy distillation lowers it.

The teacher is the model of ``teacher.model``, or a tiny model cold-started like the policy's (``teacher.tiny``, in
``<output_dir>/teacher_cold_start`` unless ``teacher.output_dir`` says otherwise, reused while its settings are
unchanged: :func:`teacher_cold_start_config`). It runs in its own instance of the run's training engine (head
``"lm"``, no LoRA adapters), so its passes run in micro-batches and across processes as the policy's do; it never
takes an optimizer step and nothing of it is checkpointed: a resumed run starts it again from the same folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines import TokenBatch
from rlzoo.rl.learner import Learner
from rlzoo.util.tensors import masked_mean

TEACHER_COLD_START = "teacher_cold_start"  # the tiny teacher's folder in the run folder, unless teacher.output_dir


@dataclass
class Teacher:
    """The teacher's log-probs of a rollout batch's sampled tokens, over the run's processes."""

    learner: Learner  # the teacher's training engine (head "lm"), never stepped, and the run's processes

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` the teacher's log-prob of every sampled response token (0 at masked positions)."""
        logp = self.learner.logprobs(batch)
        return torch.where(batch.response_mask > 0, logp, torch.zeros_like(logp))


@torch.no_grad()
def distill_metrics(old_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``distill/reverse_kl``: the token-mean over policy tokens of ``old_logp - teacher_logp``."""
    return {"distill/reverse_kl": masked_mean(old_logp.double() - teacher_logp.double(), mask).item()}


def teacher_cold_start_config(config: RunConfig) -> RunConfig:
    """The run's config as the tiny teacher's cold start reads it: ``model.tiny`` is ``teacher.tiny`` and the folder
    its own, everything else (task, seed, prompts, cold_start settings) the policy's, so both share one tokenizer."""
    teacher = config.teacher
    folder = teacher.output_dir or str(Path(config.output_dir) / TEACHER_COLD_START)
    return config.model_copy(update={
        "model": config.model.model_copy(update={"path": None, "tiny": teacher.tiny}),
        "cold_start": config.cold_start.model_copy(update={"output_dir": folder, "enabled": True}),
    })
