"""Batches and processes: a step's rows split into equal minibatches, each with a row for every process, and a
rollout engine that can run under a launcher (its declared capabilities)."""

from __future__ import annotations

from rlzoo.config.schema import RunConfig
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Problem, RunFacts


def data_parallel_problem(config: RunConfig, world: int, prompts: int | None = None) -> str | None:
    """Every rank needs at least one row of every minibatch; ``prompts`` defaults to rollout.prompts_per_step."""
    if world <= 1:
        return None
    prompts = config.rollout.prompts_per_step if prompts is None else prompts
    rows = prompts * config.rollout.group_size
    minibatches = config.algorithm.minibatches_per_rollout
    if rows // minibatches >= world:
        return None
    return (
        f"{world} processes need at least {world} rows in every minibatch, but a step's {rows} rows "
        f"(rollout.prompts_per_step x rollout.group_size) in {minibatches} minibatches "
        f"(algorithm.minibatches_per_rollout) leave {rows // minibatches}: raise the batch, lower "
        f"minibatches_per_rollout, or run fewer processes"
    )


def check_data_parallel(config: RunConfig, world: int, prompts: int | None = None) -> None:
    """:func:`data_parallel_problem` as an :class:`RlzooError` (the run checks again once the task's size is known)."""
    problem = data_parallel_problem(config, world, prompts)
    if problem is not None:
        raise RlzooError(problem)


def batch_rule(run: RunFacts) -> list[Problem]:
    """``rollout.prompts_per_step x rollout.group_size`` rows split into ``algorithm.minibatches_per_rollout`` equal
    minibatches, each with a row for every process; several processes need a rollout engine that runs under a
    launcher."""
    config, registry, world = run.config, run.registry, run.world
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    minibatches = config.algorithm.minibatches_per_rollout
    problems = []
    if rows % minibatches:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        problems.append(
            (
                "algorithm.minibatches_per_rollout",
                f"{minibatches} does not divide a step's {rows} rows (rollout.prompts_per_step "
                f"{config.rollout.prompts_per_step} x rollout.group_size {config.rollout.group_size}) into equal "
                f"minibatches; use one of {divisors}",
            )
        )
    problem = data_parallel_problem(config, world)
    if problem is not None:
        problems.append(("algorithm.minibatches_per_rollout", problem))
    rollout = registry.get("rollout_engine", config.rollout.engine.name).cls
    per_rank = config.rollout.per_rank and rollout.runs_per_rank
    if world > 1 and not rollout.runs_under_launcher and not per_rank:
        usable = [i.name for i in registry.components("rollout_engine") if i.cls.runs_under_launcher]
        hint = " or rollout.per_rank: true" if rollout.runs_per_rank else ""
        problems.append(
            (
                "rollout.engine.name",
                f"{rollout.name!r} cannot run inside rank 0 alone of a multi-process run (building it is collective "
                f"over the run's process group); use {' or '.join(f'{{name: {name}}}' for name in usable)}{hint} for "
                "multi-process runs",
            )
        )
    return problems
