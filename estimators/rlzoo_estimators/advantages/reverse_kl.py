"""On-policy distillation: the teacher's per-token reverse KL as the advantage, optionally plus a task advantage.

For every policy token y_t of a sampled response (mask 1; 0 elsewhere):

    A_t = kl_coef * (log p_teacher(y_t) - log p_old(y_t))  +  task_coef * A_task_t

``log p_old`` is the behaviour policy's log-prob (the loop's old log-probs, ``RewardBatch.old_logprobs``) and
``log p_teacher`` the teacher's (``RewardBatch.teacher_logprobs``). ``log p_old - log p_teacher`` at a token the
student sampled is a one-sample estimate of the per-token reverse KL, KL(student || teacher), so maximising
``A_t`` with the usual policy-gradient machinery lowers it. Each token's advantage is its own term only
(discount 0), as in Thinking Machines' "On-Policy Distillation" (Lu 2025), whose per-token advantage this is.
The on-policy setting is GKD's (Agarwal et al. 2024, arXiv:2306.13649): TRL's ``GKDTrainer`` with ``lmbda=1``
(student samples only) and ``beta=1`` (reverse KL) and verl's GKD recipe minimise the same divergence, computed
over the full vocabulary instead of sampled. ``A_task`` is a nested advantage source of the task reward
(``task``, default ``group``); ``task: null`` is pure distillation.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

import rlzoo
from rlzoo.errors import ConfigError, RegistryError, RlzooError
from rlzoo.interfaces import AdvantageSource, Params, Problem, RewardBatch, RunFacts
from rlzoo_estimators._util import float_dtype, masked

DEFAULT_TASK = "group"  # the task reward's advantage unless told: GRPO's


def _error(loc: tuple[str | int, ...], message: str, value: Any) -> InitErrorDetails:
    """A validation error at ``loc`` (below ``task``) whose message is ``message`` as it is."""
    error = PydanticCustomError("nested_advantage", "{message}", {"message": message})
    return InitErrorDetails(type=error, loc=loc, input=value)


@rlzoo.register("advantage", "reverse-kl")
class ReverseKLAdvantage(AdvantageSource):
    """On-policy distillation: A_t = kl_coef (log p_teacher - log p_old)(y_t) + task_coef A_task_t, per policy token.

    The per-token reverse KL to a teacher (``teacher``) as an advantage, discount 0 (Thinking Machines' on-policy
    distillation), added to the advantage of a nested source of the task reward (``task``; null: none). Its
    capabilities are the nested source's (``needs_values``, ``needs_step_rewards``, ``reads_token_rewards``,
    ``needs_greedy_baseline``, ``needs_reward_parts``; its own preflight refuses what no run supplies) plus
    ``needs_teacher``; the critic's returns, if any, are the nested source's.
    """

    formula = "A_t = kl_coef * (log p_teacher(y_t) - log p_old(y_t)) + task_coef * A_task_t"
    reference = "On-Policy Distillation (Lu, Thinking Machines 2025); GKD (Agarwal et al. 2024, arXiv:2306.13649)"
    trl_name = "GKDTrainer (lmbda=1, beta=1)"
    needs_teacher = True

    class Params(Params):
        kl_coef: float = Field(1.0, ge=0.0, description="weight of the per-token log p_teacher - log p_old")
        task: dict[str, Any] | None = Field(
            {"name": DEFAULT_TASK},
            validate_default=True,  # the resolved config shows the default source's parameters too
            description="the task reward's advantage source, {name: <advantage>, ...its parameters}; null: "
            "pure distillation",
        )
        task_coef: float = Field(1.0, ge=0.0, description="weight of the task advantage")

        @field_validator("task")
        @classmethod
        def _nested(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
            """The nested source's name and parameters validated by the registry; the result holds every parameter."""
            if spec is None:
                return None
            params = dict(spec)
            name = params.pop("name", None)
            if not isinstance(name, str):
                message = "names an advantage source: {name: <advantage>, ...its parameters}, or null"
                raise ValidationError.from_exception_data("task", [_error(("name",), message, name)])
            try:
                validated = rlzoo.default_registry().validate_params("advantage", name, params)
            except RegistryError as err:  # an unknown name, or one registered twice
                raise ValidationError.from_exception_data("task", [_error(("name",), str(err), name)]) from None
            except ConfigError as err:  # its parameters, at their own (dotted) fields
                errors = [_error(tuple(f for f in loc.split(".") if f), text, params) for loc, text in err.problems]
                raise ValidationError.from_exception_data("task", errors) from None
            return {"name": name, **validated.model_dump()}

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self.task: AdvantageSource | None = None
        spec = self.params.task
        if spec is not None:
            spec = dict(spec)
            name = spec.pop("name")
            try:
                self.task = rlzoo.default_registry().create("advantage", name, spec, loc="task")
            except ConfigError as err:
                raise RlzooError("; ".join(f"{loc}: {message}" for loc, message in err.problems)) from err
            # what the nested source reads, the run must supply: its capabilities are this instance's
            self.needs_values = self.task.needs_values
            self.needs_step_rewards = self.task.needs_step_rewards
            self.reads_token_rewards = self.task.reads_token_rewards
            self.needs_greedy_baseline = self.task.needs_greedy_baseline
            self.needs_reward_parts = self.task.needs_reward_parts

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """The nested source's rules at ``<at>.task``, then this source's own (the teacher) on the fields the nested
        source's problems leave (its capabilities are the nested source's, so they would repeat them)."""
        problems = self.task.preflight(run, f"{at}.task") if self.task is not None else []
        reported = {field for field, _ in problems}
        return problems + [p for p in super().preflight(run, at) if p[0] not in reported]

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        return self.advantages_and_returns(batch)[0]

    def advantages_and_returns(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        what = "the teacher's and the behaviour policy's log-probs of the sampled tokens"
        batch.require(self.name, what, "teacher_logprobs", "old_logprobs")
        p = self.params
        signal = p.kl_coef * (batch.teacher_logprobs.detach().double() - batch.old_logprobs.detach().double())
        advantages = masked(signal, batch.mask)
        returns = None
        if self.task is not None:
            task, returns = self.task.advantages_and_returns(batch)
            advantages = advantages + p.task_coef * masked(task.detach().double(), batch.mask)
        return advantages.to(float_dtype(batch.old_logprobs, batch.teacher_logprobs)), returns
