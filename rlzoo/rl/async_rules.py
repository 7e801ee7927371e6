"""The preflight's rules about ``rollout.max_staleness`` (:mod:`rlzoo.rl.async_rollouts`) and its companions
``rollout.queue_size`` and ``rollout.partial``."""

from __future__ import annotations

from rlzoo.interfaces import Problem, RunFacts


def async_rule(run: RunFacts) -> list[Problem]:
    """Not with the overlap schedule, a queue that holds a step's batch, and partial rollouts only where the rollout
    engine declares it can stop or update a generation in flight (one process or several: a producer thread on each
    rank that samples, its gathers in a process group of their own)."""
    rollout = run.config.rollout
    k = rollout.max_staleness
    problems: list[Problem] = []
    if k is None:
        for name in ("queue_size", "partial"):
            if name in rollout.model_fields_set and getattr(rollout, name) != type(rollout).model_fields[name].default:
                problems.append((f"rollout.{name}", "only with rollout.max_staleness (null here: no producer thread)"))
        return problems
    if rollout.overlap:
        problems.append(
            (
                "rollout.max_staleness",
                "not with rollout.overlap: 1 (overlap is the one-step-stale schedule with old log-probs under the "
                "sampling weights; max_staleness is the producer thread): set one of them",
            )
        )
    batch = rollout.prompts_per_step * rollout.group_size
    if rollout.queue_size is not None and rollout.queue_size < batch:
        problems.append(
            (
                "rollout.queue_size",
                f"{rollout.queue_size} responses is less than one step's batch, prompts_per_step x group_size = {batch}",
            )
        )
    engine = run.rollout_engine
    if rollout.partial != "off" and engine is not None and not type(engine).updates_in_flight:
        problems.append(
            (
                "rollout.partial",
                f"{rollout.partial!r} needs a rollout engine that can stop or update its weights mid-generation; "
                f"{engine.name!r} loads weights between batches only: use off",
            )
        )
    return problems
