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
from rlzoo.interfaces import Problem, RunFacts, Task
from rlzoo.models.folder import MISSING, NOT_A_MODEL_FOLDER, ModelFolder, read_config
from rlzoo.models.memory import ModelShape
from rlzoo.models.tokenizer import char_vocab, vocab_difference
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
    if teacher is None or teacher.tiny is None:
        raise ValueError("teacher_cold_start_config: the run has no tiny teacher (teacher.tiny)")
    folder = teacher.output_dir or str(Path(config.output_dir) / TEACHER_COLD_START)
    return config.model_copy(
        update={
            "model": config.model.model_copy(update={"path": None, "tiny": teacher.tiny}),
            "cold_start": config.cold_start.model_copy(update={"output_dir": folder, "enabled": True}),
        }
    )


def teacher_shape(config: RunConfig) -> ModelShape | None:
    """The teacher's sizes for the memory estimate (``None``: no teacher, or a config.json :func:`teacher_rule`
    reports)."""
    teacher = config.teacher
    if teacher is None:
        return None
    if teacher.tiny is not None:
        return ModelShape.from_tiny(teacher.tiny)
    assert teacher.model is not None  # TeacherConfig: exactly one of model and tiny
    hf, _ = read_config(Path(teacher.model) / "config.json")
    return ModelShape.from_hf(hf) if hf is not None else None


def teacher_rule(run: RunFacts) -> list[Problem]:
    """A teacher (``teacher``) is read by the advantage source (``needs_teacher``; the source's own check refuses the
    opposite) and scores the policy's token ids: a model folder with weights and the policy's tokenizer (the same
    token -> id map) whose ``vocab_size`` covers every id the policy can sample (the policy's ``vocab_size``; a larger,
    padded embedding is fine: only the sampled tokens' log-probs are read), or a tiny teacher of valid sizes,
    cold-started on the task's character tokenizer."""
    teacher = run.config.teacher
    if teacher is None:
        return []
    problems: list[Problem] = []
    advantage = run.components.get("algorithm.advantage")
    if advantage is not None and not advantage.needs_teacher:
        usable = run.names("advantage", lambda cls: cls.needs_teacher)
        problems.append(
            (
                "teacher",
                f"set, but advantage {advantage.name!r} (algorithm.advantage) reads no teacher, so its passes would be "
                f"wasted: use an advantage that reads one ({', '.join(usable)}), or teacher: null",
            )
        )
    policy, source = _policy_vocab(run)
    if teacher.tiny is not None:
        problems += [(f"teacher.tiny.{field}", message) for field, message in teacher.tiny.shape_problems()]
        task = run.components.get("task")
        mismatch = vocab_difference(_char_vocab(task), policy, "teacher") if task is not None else None
        if mismatch:
            problems.append(
                (
                    "teacher.tiny",
                    f"a tiny teacher is cold-started on the task's character tokenizer, which differs from the policy's "
                    f"({source}): {mismatch}; use teacher.model, a folder with the policy's tokenizer",
                )
            )
        return problems
    assert teacher.model is not None  # TeacherConfig: exactly one of model and tiny
    return problems + _teacher_folder_problems(run, Path(teacher.model), policy, source)


def _teacher_folder_problems(run: RunFacts, path: Path, policy: dict[str, int] | None, source: str) -> list[Problem]:
    """``teacher.model``: a model folder with weights and the policy's tokenizer, covering the policy's ids."""
    loc, folder = "teacher.model", ModelFolder.read(path)
    if folder.absent is not None:
        what = MISSING if folder.absent == MISSING else NOT_A_MODEL_FOLDER
        return [
            (
                loc,
                f"{path} {what}; name a model folder (config.json, weights, the policy's tokenizer), or use "
                "teacher.tiny",
            )
        ]
    if folder.config is None:
        return [(loc, str(folder.unreadable))]
    problems = [(loc, message) for message in folder.problems()]
    if not folder.tokenizer_file.is_file():
        return problems + [
            (
                loc,
                f"{path} has no tokenizer.json to compare with the policy's tokenizer; save the "
                "teacher's tokenizer into the folder",
            )
        ]
    vocab, unreadable = folder.vocab()
    if vocab is None:
        return problems + [(loc, str(unreadable))]
    if (problem := folder.vocab_problem(vocab)) is not None:
        problems.append((loc, problem))
    size, sampled = folder.config.get("vocab_size"), _policy_vocab_size(run, policy)
    if isinstance(size, int) and sampled is not None and size < sampled:
        problems.append(
            (
                loc,
                f"{path} has vocab_size {size} but the policy's is {sampled}: the policy can sample every id up to "
                f"{sampled - 1} and the teacher scores each one; use a teacher whose vocab_size is at least {sampled}",
            )
        )
    mismatch = vocab_difference(vocab, policy, "teacher")
    if mismatch:
        problems.append(
            (
                loc,
                f"the tokenizer of {path} differs from the policy's ({source}): {mismatch}; the teacher scores the "
                "policy's token ids, so both need one tokenizer: use a teacher built on the policy's tokenizer",
            )
        )
    return problems


def _char_vocab(task: Task) -> dict[str, int]:
    """The character tokenizer's vocabulary a cold start builds for ``task``."""
    return char_vocab(task.alphabet())


def _policy_vocab(run: RunFacts) -> tuple[dict[str, int] | None, str]:
    """The policy's token -> id map (``None`` when it cannot be read here) and where it comes from."""
    if run.config.model.path is None:
        task = run.components.get("task")
        return (_char_vocab(task) if task is not None else None), "the task's character tokenizer, model.tiny"
    # None: no folder here (--model-config), or a problem of model.path reported already
    return ModelFolder(Path(run.config.model.path)).vocab()[0], "model.path"


def _policy_vocab_size(run: RunFacts, policy: dict[str, int] | None) -> int | None:
    """How many token ids the policy can sample: its config.json ``vocab_size`` (``None`` if unknown), or the tiny
    model's tokenizer length."""
    if run.config.model.path is None:
        return max(policy.values()) + 1 if policy else None
    if run.model.shape is not None:
        return run.model.shape.vocab
    hf, _ = read_config(Path(run.config.model.path) / "config.json")  # unreadable: a problem of model.path
    size = hf.get("vocab_size") if hf is not None else None
    return size if isinstance(size, int) else None
