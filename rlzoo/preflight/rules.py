"""The preflight's rules, in the order their problems are reported: each ``(RunFacts) -> list[Problem]``.

A rule lives with what it checks: the critic's in :mod:`rlzoo.rl.critic`, the teacher's in :mod:`rlzoo.rl.teacher`,
LoRA's in :mod:`rlzoo.engines.lora`, ``rollout.overlap``'s in :mod:`rlzoo.rl.overlap_rules`, ``rollout.max_staleness``'s
in :mod:`rlzoo.rl.async_rules`, the prompts' and
episodes' in :mod:`rlzoo.episodes.rules`, each component's in its own :meth:`rlzoo.interfaces.Component.preflight`
(:func:`component_rule`); the rules about the run as a whole (installed packages, the policy's model, GPU memory,
batches, evaluation, the run folder, what a resume may change) live in this package, one module each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rlzoo.component_errors import component_raised
from rlzoo.engines.lora import lora_rule
from rlzoo.episodes.rules import (
    chat_template_rule,
    episode_rule,
    prompt_room_rule,
    response_room_rule,
    tool_markup_rule,
)
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.preflight.batches import batch_rule
from rlzoo.preflight.evaluation import evaluation_rule
from rlzoo.preflight.folders import run_folder_rule
from rlzoo.preflight.memory_fit import memory_rule
from rlzoo.preflight.model import model_rule
from rlzoo.preflight.packages import component_package_rule, device_rule, engine_package_rule
from rlzoo.preflight.resume_changes import resume_change_rule
from rlzoo.rl.async_rules import async_rule
from rlzoo.rl.critic import critic_rule
from rlzoo.rl.overlap_rules import overlap_rule
from rlzoo.rl.teacher import teacher_rule

Rule = Callable[[RunFacts], list[Problem]]
log = logging.getLogger(__name__)


def component_rule(run: RunFacts) -> list[Problem]:
    """Each constructed component's own rules (:meth:`rlzoo.interfaces.Component.preflight`), by its field. One
    whose ``preflight`` raises is a problem at its field naming it, its file and the exception (the traceback is
    logged: ``--verbose`` shows it)."""
    problems: list[Problem] = []
    for loc, component in run.components.items():
        try:
            problems += component.preflight(run, loc)
        except Exception as exc:  # a plugin's bug: reported where the config names it, the others still checked
            log.info("the traceback of %s's preflight:", loc, exc_info=exc)
            distribution = run.registry.get(component.kind, component.name).distribution
            problems.append((loc, component_raised(component, exc, distribution)))
    return problems


RULES: tuple[Rule, ...] = (
    engine_package_rule,
    component_package_rule,
    device_rule,
    model_rule,
    memory_rule,
    chat_template_rule,
    response_room_rule,
    episode_rule,
    tool_markup_rule,
    prompt_room_rule,
    batch_rule,
    overlap_rule,
    async_rule,
    critic_rule,
    lora_rule,
    teacher_rule,
    component_rule,
    evaluation_rule,
    run_folder_rule,
    resume_change_rule,
)
