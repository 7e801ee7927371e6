"""The preflight's rules about ``rollout.max_staleness`` (:mod:`rlzoo.rl.async_rollouts`) and its companions
``rollout.queue_size`` and ``rollout.partial``."""

from __future__ import annotations

from rlzoo.interfaces import Problem, RunFacts


def async_rule(run: RunFacts) -> list[Problem]:
    """A producer thread in one process, a queue that holds a step's batch, and partial rollouts only where the
    rollout engine declares it can stop or update a generation in flight."""
    rollout = run.config.rollout
    k = rollout.max_staleness
    problems: list[Problem] = []
    if k is None:
        for name in ("queue_size", "partial"):
            if name in rollout.model_fields_set and getattr(rollout, name) != type(rollout).model_fields[name].default:
                problems.append((f"rollout.{name}", "only with rollout.max_staleness (null here: no producer thread)"))
        return problems
    if rollout.overlap:
        problems.append((
            "rollout.max_staleness",
            "not with rollout.overlap: 1 (overlap is the one-step-stale schedule with old log-probs under the "
            "sampling weights; max_staleness is the producer thread): set one of them",
        ))
    if run.world > 1:
        problems.append((
            "rollout.max_staleness",
            f"the producer thread runs in one process; this run has {run.world} (the ranks meet at the update's "
            "collectives while rank 0 samples): use rollout.max_staleness: null with several processes",
        ))
    batch = rollout.prompts_per_step * rollout.group_size
    if rollout.queue_size is not None and rollout.queue_size < batch:
        problems.append((
            "rollout.queue_size",
            f"{rollout.queue_size} responses is less than one step's batch, prompts_per_step x group_size = {batch}",
        ))
    engine = run.rollout_engine
    if rollout.partial != "off" and engine is not None and not type(engine).updates_in_flight:
        problems.append((
            "rollout.partial",
            f"{rollout.partial!r} needs a rollout engine that can stop or update its weights mid-generation; "
            f"{engine.name!r} loads weights between batches only: use off",
        ))
    return problems
