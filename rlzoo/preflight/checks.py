"""Preflight: check a resolved run config against everything a run needs, before anything heavy starts.

``rlzoo config check`` and ``rlzoo train`` both call :func:`preflight` (train first thing, in
:func:`rlzoo.runtime.run.train`), so a config the check accepts does not fail while a run starts, and one it rejects
fails in a second, naming every problem at once. It reads config values, looks at files and folders, asks
whether Python packages are installed (``importlib.util.find_spec``) and consults the registry's component
classes; it never loads weights or imports an engine's library (vLLM, DeepSpeed), and builds a model only as a
skeleton on the meta device, to match ``model.lora``'s targets.

It builds the run's :class:`~rlzoo.interfaces.RunFacts` once, then runs :data:`rlzoo.preflight.rules.RULES` on them,
each ``(facts) -> problems`` (a problem is ``(dotted.field, message saying what is allowed)``), in this order:

- components: every component the config names is constructed (no engine is started), so one whose constructor
  raises is reported as ``<field>: <kind> <name> (<distribution>) failed to set up: <message>``;
- engines: the packages the chosen rollout / training engine needs are installed, and a GPU where ``device: cuda``
  asks for one (:mod:`rlzoo.preflight.packages`);
- the model (:mod:`rlzoo.preflight.model`): ``model.path`` is a Hugging Face folder (``config.json``, weights, a
  tokenizer whose ids fit the model's ``vocab_size``), or, without it, the cold start is enabled and ``model.tiny``
  meets :meth:`rlzoo.config.schema.TinyModelConfig.shape_problems`;
- GPU memory: with a device memory (``trainer.device_memory``, or ``rlzoo config check --device-memory``), the
  estimate per rank (:mod:`rlzoo.models.memory`, each engine answering for its own part) fits in it
  (:mod:`rlzoo.preflight.memory_fit`);
- prompts and episodes (:mod:`rlzoo.episodes.rules`): chat prompts (a task giving chat messages, or
  ``prompt.plain: chat``) need a tokenizer with a chat template; ``prompt.max_prompt_tokens +
  rollout.max_new_tokens`` and an episode's tokens fit the context (the model's, or the rollout engine's limit,
  ``RolloutEngine.context_tokens``);
- batches (:mod:`rlzoo.preflight.batches`): ``rollout.prompts_per_step x rollout.group_size`` rows split into
  ``algorithm.minibatches_per_rollout`` equal minibatches, each with a row for every process
  (:func:`~rlzoo.preflight.batches.check_data_parallel`), and a rollout engine that can run under a launcher (its
  declared capabilities);
- ``rollout.overlap: 1`` only in one process (:mod:`rlzoo.rl.overlap_rules`);
- a critic, LoRA adapters and a teacher, each by its own rule (:mod:`rlzoo.rl.critic`, :mod:`rlzoo.engines.lora`,
  :mod:`rlzoo.rl.teacher`): a teacher only with an advantage source that reads it, and one that scores the policy's
  token ids (a model folder with the policy's tokenizer and at least its ``vocab_size``, or valid ``teacher.tiny``
  sizes, cold-started on the task's character tokenizer, which the policy must use);
- each component's own rules, :meth:`rlzoo.interfaces.Component.preflight`. Every rule about one engine lives in that
  engine (vLLM's head sizes, context length and KV cache; DeepSpeed's ZeRO / expert-parallel / process-count rules),
  every rule about one component kind on its base class (a router policy that replays needs an MoE model;
  ``algorithm.old_logprobs: rollout-only`` needs a correction and a router policy that read no old pass; a reward
  shaper's length budget; the task's own cheap checks and its default verifier). This package names no engine and
  reads no component's parameters;
- evaluation settings that cannot sample (several greedy samples per prompt; :mod:`rlzoo.preflight.evaluation`);
- the run folder (:mod:`rlzoo.preflight.folders`): ``--resume`` names a folder with a checkpoint
  (``checkpoints/latest``; whether it or an earlier one is intact is verified against its digests when the run
  starts); otherwise ``output_dir`` holds no run; ``output_dir`` (and ``cold_start.output_dir`` when a cold start is
  built there) is a folder this user can write, or can be made (:func:`~rlzoo.preflight.folders.folder_problem`);
- a resume changes nothing but what :mod:`rlzoo.preflight.resume_changes` allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlzoo.config.resolution import iter_component_specs
from rlzoo.config.schema import RunConfig
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import Component, Problem, RunFacts
from rlzoo.models.memory import MemoryEstimate, estimate
from rlzoo.preflight.memory_fit import device_memory_limit
from rlzoo.preflight.model import policy_facts
from rlzoo.preflight.rules import RULES
from rlzoo.registry import Registry
from rlzoo.rl.teacher import teacher_shape


def preflight(
    config: RunConfig,
    registry: Registry,
    *,
    resume: Path | None = None,
    world: int = 1,
    model_config: Path | None = None,
    device_memory: int | None = None,
    allow_changes: Sequence[str] = (),
) -> MemoryEstimate | None:
    """Raise :class:`ConfigError` listing every problem that would stop ``rlzoo train`` with this config; return
    the run's GPU memory estimate per rank (:mod:`rlzoo.models.memory`), or ``None`` if the model's sizes are
    unknown.

    ``config`` is the resolved config (:func:`rlzoo.config.resolution.load_config`); ``resume`` the ``--resume`` run
    folder; ``world`` the number of processes the run is launched with (``WORLD_SIZE``); ``allow_changes`` the fields
    a resume may change besides :data:`rlzoo.preflight.resume_changes.RESUMABLE` (``--allow-changes``).
    ``model_config`` (``rlzoo config check --model-config FILE``) is a ``config.json`` that stands in for the
    ``model.path`` folder, for a recipe whose model is not on this machine: the model's shapes are checked from it,
    and the folder's weights, tokenizer and chat template are not checked at all (``rlzoo train`` has no such
    option). ``device_memory`` (bytes; ``rlzoo config check --device-memory``) replaces ``trainer.device_memory``.
    """
    components, problems = _construct(config, registry)
    run = RunFacts(
        config,
        policy_facts(config, model_config),
        world,
        registry,
        components,
        resume=None if resume is None else Path(resume),
        allow_changes=tuple(allow_changes),
    )
    _estimate_memory(run, device_memory)
    for rule in RULES:
        problems += rule(run)
    if problems:
        raise ConfigError(problems)
    return run.memory


def _construct(config: RunConfig, registry: Registry) -> tuple[dict[str, Component], list[Problem]]:
    """Every component the config names, constructed (engines too: constructing one starts nothing), so a
    component that fails at set-up is reported here, by field, before ``rlzoo train`` starts any engine."""
    components: dict[str, Component] = {}
    problems: list[Problem] = []
    for loc, spec in iter_component_specs(config):
        try:
            components[loc] = registry.create(spec.kind, spec.name, spec.params, loc=loc)
        except ConfigError as err:
            problems += err.problems
        except RlzooError as err:
            problems.append((loc, str(err)))
    return components, problems


def _estimate_memory(run: RunFacts, device_memory: int | None) -> None:
    """The run's GPU memory per rank, when the model's sizes and both engines are known; the memory of one GPU to
    check it against (``device_memory``, else ``trainer.device_memory``), unless the model's own problems leave the
    estimate unknown."""
    training, rollout = run.training_engine, run.rollout_engine
    if run.model.shape is not None and training is not None and rollout is not None:
        run.memory = estimate(
            run.config,
            run.model.shape,
            run.world,
            training=training,
            rollout=rollout,
            teacher=teacher_shape(run.config),
        )
    limit = device_memory_limit(run.config, device_memory)
    if limit is not None and (run.memory is not None or not run.model.problems):
        run.device_memory_field, run.device_memory = limit
