"""GPU memory: with a device memory (``trainer.device_memory``, or ``rlzoo config check --device-memory``), the
estimate per rank (:mod:`rlzoo.models.memory`, each engine answering for its own part) fits in it."""

from __future__ import annotations

from typing import Any

from rlzoo.config.schema import RunConfig
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models import memory
from rlzoo.models.memory import REQUIRED_SIZES, MemoryEstimate, ModelShape
from rlzoo.registry import Registry, default_registry
from rlzoo.util.units import format_bytes, parse_bytes


def device_memory_limit(config: RunConfig, override: int | None = None) -> tuple[str, int] | None:
    """``(where it was set, bytes)`` of one GPU's memory: ``override`` (``--device-memory``), else
    ``trainer.device_memory`` (validated by the config); ``None``: no limit to check."""
    if override is not None:
        return "--device-memory", override
    if config.trainer.device_memory is not None:
        return "trainer.device_memory", parse_bytes(config.trainer.device_memory)
    return None


def memory_rule(run: RunFacts) -> list[Problem]:
    """The estimate per rank must fit in ``run.device_memory``; the message names what lowers its largest parts."""
    limit, loc, memory = run.device_memory, str(run.device_memory_field), run.memory
    if limit is None:
        return []
    if memory is None:
        return [
            (
                loc,
                f"the model's config.json lacks the sizes the memory estimate needs ({', '.join(REQUIRED_SIZES)}"
                "); set trainer.device_memory: null to skip the check",
            )
        ]
    if memory.fits(limit):
        return []
    parts, total = memory.bytes_on(limit), memory.total(limit)
    groups: dict[str, list[str]] = {}  # the parts one change shrinks
    for name, hint in _memory_hints(run).items():
        if parts.get(name, 0) >= total / 100:  # the parts that matter
            groups.setdefault(hint, []).append(name)
    ranked = sorted(groups.items(), key=lambda group: -sum(parts[name] for name in group[1]))
    hints = [f"{' + '.join(names)} ({format_bytes(sum(parts[n] for n in names))}): {hint}" for hint, names in ranked]
    return [
        (
            loc,
            "\n".join(
                [
                    f"{format_bytes(limit)} per GPU is less than the run's estimated {format_bytes(total)} per "
                    "rank (rlzoo.models.memory); to fit:",
                    *(f"    - {hint}" for hint in hints),
                    "    estimate per rank:",
                    *(f"      {line}" for line in memory.lines(limit)),
                ]
            ),
        )
    ]


def _memory_hints(run: RunFacts) -> dict[str, str]:
    """For each part of the estimate that the config can shrink: the fields to change (the engines' parts: what
    each engine says shrinks them)."""
    t, config = run.config.trainer, run.config
    checkpointing = "" if t.activation_checkpointing else ", or set trainer.activation_checkpointing: true"
    hints = {
        "activations": f"lower trainer.max_tokens_per_micro_batch (now {t.max_tokens_per_micro_batch}){checkpointing}",
        "logits": f"lower trainer.logits_chunk_tokens (now {t.logits_chunk_tokens})",
        "reference": f"algorithm.kl_coef: 0 drops the KL reference model (now {config.algorithm.kl_coef})",
        "teacher": "a smaller teacher (teacher.model or teacher.tiny)",
        "rollout": run.rollout_engine.memory_hint(run),
    }
    state = run.training_engine.memory_hint(run)
    hints.update(dict.fromkeys(("optimizer", "gradients", "weights", "master_copy"), state))
    return hints


def estimate(
    config: RunConfig,
    shape: ModelShape,
    world: int = 1,
    *,
    training: Any = None,
    rollout: Any = None,
    teacher: ModelShape | None = None,
    registry: Registry | None = None,
) -> MemoryEstimate:
    """:func:`rlzoo.models.memory.estimate` of ``config``, its engines constructed from ``registry`` (the default
    registry if none is given) where ``training`` / ``rollout`` are not given."""
    if training is None or rollout is None:
        registry = registry or default_registry()
        trainer_spec, rollout_spec = config.trainer.engine, config.rollout.engine
        training = training or registry.create("training_engine", trainer_spec.name, trainer_spec.params)
        rollout = rollout or registry.create("rollout_engine", rollout_spec.name, rollout_spec.params)
    return memory.estimate(config, shape, world, training=training, rollout=rollout, teacher=teacher)
