"""Assembling a run from its config, and the driver around the loop: evaluation, checkpoints, resume.

Run folder::

    config.yaml            the resolved config
    metrics.jsonl          one line per step (keys in docs/metrics.md); the last line is the final evaluation
    cold_start/            the cold-start model (unless model.path or cold_start.output_dir say otherwise)
    checkpoints/step_N/    model/ (HF folder, safetensors), optimizer.safetensors + .json, rng.*, state.json
    checkpoints/latest     name of the newest complete checkpoint

Several processes (``torchrun --nproc_per_node N -m rlzoo.cli train CONFIG``; docs/distributed.md): every rank
runs :func:`train` and trains its share of each minibatch with a data-parallel training engine (``deepspeed``).
Rank 0 alone builds the cold start (the others wait, then load it), owns the rollout engine (samples, scores,
evaluates), logs ``metrics.jsonl`` and the progress bar, and writes the checkpoint's shared files (tokenizer, RNG,
``state.json``, ``latest``); every rank writes its own engine state into the same checkpoint folder.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from rlzoo import distributed, loop
from rlzoo.checkpoint import atomic_directory, atomic_write_text, latest_checkpoint, rng_state, set_rng_state
from rlzoo.config import RunConfig, dump_config
from rlzoo.engines import EngineContext
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Task
from rlzoo.metrics import MetricsLogger, NullMetricsLogger
from rlzoo.objective import build_objective
from rlzoo.preflight import check_data_parallel, preflight
from rlzoo.registry import Registry, default_registry
from rlzoo.sft import ensure_cold_start

log = logging.getLogger("rlzoo.run")


def create(registry: Registry, kind: str, spec) -> object:
    return registry.create(kind, spec.name, spec.params)


def make_task(config: RunConfig, registry: Registry) -> Task:
    return create(registry, "task", config.task)


def verifier_for(config: RunConfig, task: Task, registry: Registry):
    if config.verifier is not None:
        return create(registry, "verifier", config.verifier)
    return registry.create("verifier", task.default_verifier)


def initial_model_dir(config: RunConfig, task: Task, registry: Registry, progress: bool = True) -> Path:
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
        rollout = registry.create("rollout_engine", "hf")
        tokenizer = _tokenizer(model_dir)
        rollout.start(_context(config, model_dir, tokenizer))
        # evaluation needs only the verifier, the rollout engine and the tokenizer
        parts = loop.Components(
            objective=None, advantage=None, verifier=verifier, rollout=rollout, trainer=None, correction=None, tokenizer=tokenizer
        )  # type: ignore[arg-type]
        return loop.evaluate(eval_set, parts, config)

    return ensure_cold_start(config, task, evaluate_fn, progress)


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _context(config: RunConfig, model_dir: Path, tokenizer) -> EngineContext:
    return EngineContext(
        model_dir=Path(model_dir),
        dtype=config.model.dtype,
        seed=config.seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _attach_router_policy(parts: loop.Components, algo, registry: Registry) -> None:
    from rlzoo.replay import StepRouting, routing_source

    parts.moe = StepRouting.applies_to(parts.trainer)
    parts.router = create(registry, "router", algo.router) if algo.router is not None else None
    source = routing_source(parts.router)
    if source != "none" and not parts.moe:
        raise RlzooError(f"algorithm.router {algo.router.name!r} needs a mixture-of-experts model; this model has no MoE router")
    # the rollout's experts are recorded for every MoE run the engine can record them for (diagnostics), and R3 needs them
    if parts.moe and hasattr(parts.rollout, "set_record_routing"):
        parts.rollout.set_record_routing(True)
    elif source == "rollout":
        raise RlzooError(
            f"algorithm.router {algo.router.name!r} needs a rollout engine that records routing; "
            f"{config_name(parts.rollout)} does not (use rollout.engine: {{name: hf}} or {{name: vllm}})"
        )


def config_name(component) -> str:
    return getattr(component, "name", type(component).__name__)


def save_checkpoint(
    run_dir: Path, completed_steps: int, parts: loop.Components, keep: int, dist: distributed.Dist = distributed.SINGLE
) -> Path:
    """Write ``checkpoints/step_N`` atomically; a collective with several processes (every rank calls it)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{completed_steps:06d}"
    with atomic_directory(final, dist) as tmp:
        parts.trainer.save(tmp)
        if dist.is_main:
            parts.tokenizer.save_pretrained(tmp / "model")
            tensors, meta = rng_state()
            save_file(tensors, str(tmp / "rng.safetensors"))
            (tmp / "rng.json").write_text(json.dumps(meta))
            (tmp / "state.json").write_text(json.dumps({"completed_steps": completed_steps}))
    if dist.is_main:
        atomic_write_text(root / "latest", final.name)
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _check_trainer_world(trainer, world: int) -> None:
    engine_world = getattr(trainer, "world_size", 1)
    if engine_world != world:
        raise RlzooError(
            f"trainer.engine {config_name(trainer)!r} trains in {engine_world} process(es) but the run was started "
            f"with {world}: multi-process runs need a data-parallel training engine (trainer.engine: "
            f"{{name: deepspeed}})"
        )


def train(config: RunConfig, resume: Path | None = None, registry: Registry | None = None, progress: bool = True) -> Path:
    """Run (or resume) RL post-training; returns the run folder. Under a launcher every rank calls this."""
    registry = registry or default_registry()
    preflight(config, registry, resume=resume, world=distributed.launched_world_size())
    dist = distributed.setup(config.trainer.engine.params.get("backend", "auto"))
    run_dir = Path(resume) if resume is not None else Path(config.output_dir)
    if resume is not None:
        config = config.model_copy(update={"output_dir": str(run_dir)})
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)

    task = make_task(config, registry)
    verifier = verifier_for(config, task, registry)
    if dist.is_main:
        start_model = initial_model_dir(config, task, registry, progress)
    dist.barrier()  # the others wait while rank 0 builds the cold start, then find and reuse it
    if not dist.is_main:
        start_model = initial_model_dir(config, task, registry, progress=False)
    checkpoint = latest_checkpoint(run_dir) if resume is not None else None
    if dist.is_main:
        atomic_write_text(run_dir / "config.yaml", dump_config(config))

    model_dir = checkpoint / "model" if checkpoint else start_model
    tokenizer = _tokenizer(model_dir)
    algo = config.algorithm
    parts = loop.Components(
        objective=build_objective(algo, registry),
        advantage=create(registry, "advantage", algo.advantage),
        verifier=verifier,
        correction=create(registry, "correction", algo.correction),
        rollout=create(registry, "rollout_engine", config.rollout.engine),  # started on rank 0 only
        trainer=create(registry, "training_engine", config.trainer.engine),
        tokenizer=tokenizer,
    )
    parts.trainer.start(_context(config, model_dir, tokenizer), config.trainer)
    if dist.active:
        _check_trainer_world(parts.trainer, dist.world)
    if dist.is_main:
        parts.rollout.start(_context(config, model_dir, tokenizer))
    _attach_router_policy(parts, algo, registry)
    if algo.kl_coef > 0:
        parts.reference = create(registry, "training_engine", config.trainer.engine)
        parts.reference.start(_context(config, start_model, tokenizer), config.trainer)

    completed = 0
    if checkpoint is not None:
        parts.trainer.load_state(checkpoint)  # a collective: every rank loads its own engine state
        set_rng_state(load_file(str(checkpoint / "rng.safetensors")), json.loads((checkpoint / "rng.json").read_text()))
        completed = json.loads((checkpoint / "state.json").read_text())["completed_steps"]

    train_set = task.samples("train", None, config.seed)
    eval_set = task.samples("eval", config.train.eval_prompts, config.seed)
    check_data_parallel(config, dist.world, min(config.rollout.prompts_per_step, len(train_set)))
    logger = MetricsLogger(run_dir, keep_below_step=completed) if dist.is_main else NullMetricsLogger()
    steps = config.train.steps
    show = progress and dist.is_main
    bar = tqdm(range(completed, steps), initial=completed, total=steps, desc="rl", disable=not show, dynamic_ncols=True, mininterval=1.0)
    try:
        for step in bar:
            metrics = {}
            if step % config.train.eval_every == 0 and dist.is_main:  # the others go on and wait for the batch
                metrics.update(loop.evaluate(eval_set, parts, config))
            metrics.update(loop.rl_step(step, loop.sample_prompts(train_set, step, config), parts, config, dist))
            logger.log(step, metrics)
            bar.set_postfix({k: f"{metrics[k]:.3f}" for k in ("reward/mean", "eval/accuracy", "clip/fraction") if k in metrics})
            if (step + 1) % config.train.checkpoint_every == 0 or step + 1 == steps:
                save_checkpoint(run_dir, step + 1, parts, config.train.keep_checkpoints, dist)
        if completed <= steps and dist.is_main:
            final = loop.evaluate(eval_set, parts, config)
            logger.log(steps, {**final, "final": 1.0})
    finally:
        logger.close()
        if dist.is_main:
            parts.rollout.close()
    distributed.teardown(dist)
    return run_dir
