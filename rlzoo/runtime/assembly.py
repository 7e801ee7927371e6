"""The building blocks a run is assembled from: components from their specs, the models it starts from, engine contexts.

Used by :class:`rlzoo.runtime.run.TrainingRun`, by ``rlzoo sft`` (the cold start alone) and by the benchmarks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.config.base import DEFAULT_ROLLOUT_ENGINE, ComponentSpec
from rlzoo.config.schema import LoraConfig, RunConfig
from rlzoo.engines import EngineContext, RolloutEngine
from rlzoo.engines.device import resolve_device
from rlzoo.episodes.assembly import build_episode_runner
from rlzoo.episodes.prompts import context_limit, context_name, fit_prompts, prompt_budget
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Task, Verifier
from rlzoo.registry import Registry
from rlzoo.rl import loop
from rlzoo.rl.teacher import teacher_cold_start_config
from rlzoo.runtime.cold_start import ensure_cold_start


def create(registry: Registry, kind: str, spec: ComponentSpec) -> Any:
    """The ``kind`` component a spec names, built with its params through the registry."""
    return registry.create(kind, spec.name, spec.params)


def make_task(config: RunConfig, registry: Registry) -> Task:
    """The config's task."""
    return create(registry, "task", config.task)


def verifier_for(config: RunConfig, task: Task, registry: Registry) -> Verifier:
    """The config's verifier, else the task's default one."""
    if config.verifier is not None:
        return create(registry, "verifier", config.verifier)
    return registry.create("verifier", task.default_verifier)


def initial_model_dir(config: RunConfig, task: Task, registry: Registry, progress: bool = True) -> Path:
    """The model RL starts from: ``model.path``, or the cold start (built and evaluated unless already there)."""
    if config.model.path:
        path = Path(config.model.path)
        if not (path / "config.json").is_file():
            raise RlzooError(f"model.path {path} is not a Hugging Face model folder (no config.json)")
        return path
    if not config.cold_start.enabled:
        raise RlzooError("model.path is null and cold_start.enabled is false: there is no model to train")
    verifier = verifier_for(config, task, registry)
    eval_set = task.samples("eval", config.train.eval_prompts, config.seed)

    def evaluate_fn(model_dir: Path) -> dict[str, float]:
        rollout = registry.create("rollout_engine", DEFAULT_ROLLOUT_ENGINE)  # in process, cheap to start
        tokenizer = load_tokenizer(model_dir)
        rollout.start(engine_context(config, model_dir, tokenizer))
        samples = fit_prompts(eval_set, tokenizer, config.prompt, "eval", *prompt_room(config, rollout, model_dir))
        episodes = build_episode_runner(config, registry, tokenizer, episode_context(rollout, model_dir))
        return loop.evaluate(samples, rollout, verifier, tokenizer, config, episodes)

    return ensure_cold_start(config, task, evaluate_fn, progress, registry)


def teacher_model_dir(config: RunConfig, task: Task, registry: Registry, progress: bool = True) -> Path | None:
    """The teacher's folder: ``teacher.model``, or the tiny teacher's cold start (built and evaluated as the policy's,
    unless already there); ``None`` without a teacher."""
    if config.teacher is None:
        return None
    if config.teacher.model:
        return Path(config.teacher.model)
    return initial_model_dir(teacher_cold_start_config(config), task, registry, progress)


def episode_context(rollout: RolloutEngine, model_dir: Path) -> int | None:
    """The most tokens an episode may hold: the smaller of the rollout engine's limit and the model's positions."""
    return context_limit(rollout.context_tokens(), model_positions(model_dir))


def prompt_room(config: RunConfig, rollout: RolloutEngine, model_dir: Path) -> tuple[int | None, str]:
    """The most prompt tokens the context leaves beside ``rollout.max_new_tokens`` (:func:`prompt_budget`; the
    context: :func:`episode_context`), and the context as a message names it (:func:`context_name`)."""
    engine, positions = rollout.context_tokens(), model_positions(model_dir)
    budget = prompt_budget(context_limit(engine, positions), config.rollout.max_new_tokens)
    return budget, context_name(engine, positions, rollout.context_option, f"max_position_embeddings of {model_dir}")


def model_positions(model_dir: Path) -> int | None:
    """The model folder's ``max_position_embeddings`` (``None`` if its config.json does not say)."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None


def load_tokenizer(model_dir: Path) -> Any:
    """The model folder's Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:  # e.g. SmolLM2 imported from GGUF by transformers 5.17: pad with the EOS token
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def engine_context(
    config: RunConfig, model_dir: Path, tokenizer: Any, lora: LoraConfig | None = None, sends_adapters: bool = False
) -> EngineContext:
    """What an engine is started with; ``lora`` for the policy's engines only (not a reference, teacher or critic),
    ``sends_adapters`` for the rollout engine (:func:`rlzoo.engines.lora.sends_adapters`, decided once by the run)."""
    return EngineContext(
        model_dir=Path(model_dir),
        dtype=config.model.dtype,
        seed=config.seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        lora=lora,
        sends_adapters=sends_adapters,
        device=resolve_device(config.device),
        run_dir=Path(config.output_dir),
    )


@dataclass
class Start:
    """Where the run starts from: its folder, the model to load, and the checkpoint to resume (if any)."""

    run_dir: Path
    initial_model: Path  # the cold-start (or user) model: the KL reference, and the weights of a fresh run
    checkpoint: Path | None
    teacher_model: Path | None = None  # the teacher's folder (teacher.model, or its cold start); frozen, never saved

    @property
    def model_dir(self) -> Path:
        """The whole model the engines start from: the checkpoint's, or the initial model when there is none or it
        holds LoRA adapters only (which the training engine then loads on top)."""
        if self.checkpoint is not None and (self.checkpoint / "model" / "config.json").is_file():
            return self.checkpoint / "model"
        return self.initial_model
