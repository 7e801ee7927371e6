"""``rlzoo train``: a run set up from its config in named steps, and the driver around the loop (evaluation,
checkpoints, resume). The building blocks the steps use are :mod:`rlzoo.runtime.assembly`.

Run folder::

    config.yaml            the resolved config
    plugins.json           the sha256 of each local plugin file (``plugins:``), as the latest start loaded it
    metrics.jsonl          one line per step (keys in docs/metrics.md); the last line is the final evaluation
    cold_start/            the cold-start model (unless model.path or cold_start.output_dir say otherwise)
    teacher_cold_start/    the tiny teacher's cold start (teacher.tiny; unless teacher.output_dir says otherwise)
    checkpoints/step_N/    model/ (HF folder, safetensors), optimizer.safetensors + .json, rng.*, state.json;
                           critic/ (the same for the critic's engine) when there is one
    checkpoints/latest     name of the newest complete checkpoint

Several processes (``torchrun --nproc_per_node N -m rlzoo.cli train CONFIG``; docs/distributed.md): every rank
runs :func:`train` and trains its share of each minibatch with a data-parallel training engine (``deepspeed``).
Every rank samples and scores its share of each step's prompts with its own rollout engine when the engine can
(``RolloutEngine.runs_per_rank`` and ``rollout.per_rank``); otherwise rank 0 alone owns the rollout engine. Rank 0
alone builds the cold start (the others wait, then load it), evaluates, logs ``metrics.jsonl`` and the progress
bar, and writes the checkpoint's shared files (tokenizer, RNG, ``state.json``, ``latest``); every rank writes its
own engine state into the same checkpoint folder.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlzoo.config.loading import dump_config
from rlzoo.config.schema import RunConfig
from rlzoo.engines.lora import sends_adapters
from rlzoo.episodes.assembly import build_episode_runner, create_tools, with_tool_descriptions
from rlzoo.episodes.prompts import fit_prompts
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.errors import RlzooError
from rlzoo.interfaces import RouterPolicy, Sample, Task, Tool, Verifier
from rlzoo.preflight.batches import check_data_parallel
from rlzoo.preflight.checks import preflight
from rlzoo.preflight.resume_changes import config_changes, record_changes, record_plugins
from rlzoo.registry import Registry, default_registry
from rlzoo.reporting.metrics_log import MetricsLogger, NullMetricsLogger
from rlzoo.reporting.trackers import Trackers, run_artifacts, start_trackers
from rlzoo.rl import loop
from rlzoo.rl.async_rollouts import AsyncRollouts
from rlzoo.rl.critic import Critic
from rlzoo.rl.learner import Learner
from rlzoo.rl.objective import build_objective
from rlzoo.rl.overlap import OverlappedRollouts
from rlzoo.rl.reward_kl import KLInReward
from rlzoo.rl.routing_learner import RoutingLearner
from rlzoo.rl.teacher import Teacher
from rlzoo.runtime import distributed, runlock
from rlzoo.runtime.assembly import (
    Start,
    create,
    engine_context,
    episode_context,
    initial_model_dir,
    load_tokenizer,
    prompt_room,
    teacher_model_dir,
    verifier_for,
)
from rlzoo.runtime.checkpoint.resume import resume_checkpoint
from rlzoo.runtime.checkpoint.store import load_checkpoint, save_checkpoint
from rlzoo.runtime.faults import FaultPolicy, component_failure
from rlzoo.util.atomic import atomic_write_text

log = logging.getLogger(__name__)


def train(
    config: RunConfig, resume: Path | None = None, registry: Registry | None = None, progress: bool = True
) -> Path:
    """Run (or resume) RL post-training; returns the run folder. Under a launcher every rank calls this."""
    registry = registry or default_registry()
    preflight(config, registry, resume=resume, world=distributed.launched_world_size())
    return TrainingRun(config, registry, resume, progress).run()


PROGRESS_KEYS = ("reward/mean", "eval/accuracy", "clip/fraction")  # shown beside the progress bar


class TrainingRun:
    """``rlzoo train``: :meth:`setup` builds the run from its config in named steps, :meth:`run` trains."""

    def __init__(
        self, config: RunConfig, registry: Registry, resume: Path | None = None, progress: bool = True
    ) -> None:
        self.config = config if resume is None else config.model_copy(update={"output_dir": str(resume)})
        self.registry = registry
        self.resume = resume
        self.progress = progress
        self.folder_lock: runlock.FileLock | None = None
        self.step: int | None = None  # the step under way (None: still setting up)

    def setup(self) -> None:
        """The run's set-up steps, in order; each uses only what the steps above it built."""
        self.trainer = create(self.registry, "training_engine", self.config.trainer.engine)  # started by _setup_trainer
        self.rollout = create(self.registry, "rollout_engine", self.config.rollout.engine)  # by _setup_rollout
        self.dist = self._setup_processes()
        self.task, self.verifier = self._setup_task()
        self.start = self._setup_start()
        self.verifier.use_run_folder(self.start.run_dir)  # state it keeps across a resume (a reply cache)
        self.tools, self.config = self._setup_tools()
        self.tokenizer = load_tokenizer(self.start.model_dir)
        self.train_set, self.eval_set = self._setup_data()
        self._setup_trainer()
        self._setup_rollout()
        self.episodes = self._setup_episodes()
        self.components = self._setup_components()
        self.completed_steps = self._restore()

    def _setup_processes(self) -> distributed.Dist:
        dist = distributed.setup(self.trainer.process_group_backend())
        torch.manual_seed(self.config.seed)
        return dist

    def _setup_task(self) -> tuple[Task, Verifier]:
        task = create(self.registry, "task", self.config.task)
        return task, verifier_for(self.config, task, self.registry)

    def _setup_start(self) -> Start:
        run_dir = Path(self.config.output_dir)
        if self.dist.is_main:  # one writer per run folder; under `rlzoo train`, which holds it already, a no-op
            self.folder_lock = runlock.hold_run_folder(run_dir, runlock.process_command(), self.resume is not None)
        # the newest intact checkpoint, verified (rlzoo.runtime.checkpoint.resume); a damaged newer one is reported and passed over
        checkpoint = resume_checkpoint(run_dir, self.dist) if self.resume is not None else None
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            initial = initial_model_dir(self.config, self.task, self.registry, self.progress)
            teacher = teacher_model_dir(self.config, self.task, self.registry, self.progress)
            if checkpoint is None:
                atomic_write_text(run_dir / "config.yaml", dump_config(self.config))
            else:  # the record of the first steps stays; what this resume changes is appended beside it
                step = int(checkpoint.name.removeprefix("step_"))
                record_changes(run_dir, step, config_changes(run_dir, self.config, self.registry))
            record_plugins(run_dir, self.config)  # the plugin files' digests, which a resume compares
        self.dist.barrier()  # the others wait while rank 0 builds the cold starts, then find and reuse them
        if not self.dist.is_main:
            initial = initial_model_dir(self.config, self.task, self.registry, progress=False)
            teacher = teacher_model_dir(self.config, self.task, self.registry, progress=False)
        return Start(run_dir, initial, checkpoint, teacher)

    def _setup_tools(self) -> tuple[dict[str, Tool], RunConfig]:
        """The tools episodes may call, and the config whose chat prompts describe them (only now: config.yaml holds
        the user's config)."""
        tools = create_tools(self.config, self.registry)
        return tools, with_tool_descriptions(self.config, tools)

    def _setup_data(self) -> tuple[list[Sample], list[Sample]]:
        """The task's train and held-out prompts, without those too long for ``prompt.max_prompt_tokens`` or for
        the context beside ``rollout.max_new_tokens`` (the rollout engine's, not yet started, or the model's)."""
        config = self.config
        room = prompt_room(config, self.rollout, self.start.model_dir)
        train_set = fit_prompts(
            self.task.samples("train", None, config.seed), self.tokenizer, config.prompt, "train", *room
        )
        check_data_parallel(config, self.dist.world, min(config.rollout.prompts_per_step, len(train_set)))
        eval_set = self.task.samples("eval", config.train.eval_prompts, config.seed)
        return train_set, fit_prompts(eval_set, self.tokenizer, config.prompt, "eval", *room)

    def _setup_trainer(self) -> None:
        trainer = self.trainer
        context = engine_context(self.config, self.start.model_dir, self.tokenizer, lora=self.config.model.lora)
        trainer.start(context, self.config.trainer)
        if trainer.world_size != self.dist.world:
            usable = [i.name for i in self.registry.components("training_engine") if i.cls.data_parallel]
            raise RlzooError(
                f"trainer.engine {trainer.name!r} trains in {trainer.world_size} process(es) but the run was started "
                f"with {self.dist.world}: multi-process runs need a data-parallel training engine (trainer.engine: "
                f"{' or '.join(f'{{name: {name}}}' for name in usable) or 'none is installed'})"
            )

    def _setup_rollout(self) -> None:
        rollout = self.rollout
        self.rollout_per_rank = self.dist.active and self.config.rollout.per_rank and rollout.runs_per_rank
        # under LoRA the adapters or the merged weights: decided here once, for the learner and the engine alike
        lora = self.config.model.lora
        self.sends_adapters = sends_adapters(rollout, lora, self.trainer.moe_layout() is not None)
        if self.dist.is_main or self.rollout_per_rank:  # otherwise this rank holds an engine that is never started
            rollout.start(engine_context(self.config, self.start.model_dir, self.tokenizer, lora, self.sends_adapters))

    def _setup_episodes(self) -> EpisodeRunner:
        """The environment (with its tools) and the limits of an episode; one turn unless the config says more."""
        context = episode_context(self.rollout, self.start.model_dir)
        return build_episode_runner(self.config, self.registry, self.tokenizer, context, self.tools)

    def _setup_components(self) -> loop.Components:
        algo = self.config.algorithm
        return loop.Components(
            objective=build_objective(algo, self.registry),
            advantage=create(self.registry, "advantage", algo.advantage),
            verifier=self.verifier,
            correction=create(self.registry, "correction", algo.correction),
            rollout=self.rollout,
            learner=self._setup_learner(),
            tokenizer=self.tokenizer,
            reference=self._setup_reference() if algo.kl_coef > 0 or algo.kl_in_reward is not None else None,
            dist=self.dist,
            rollout_per_rank=self.rollout_per_rank,
            batch_filter=create(self.registry, "batch_filter", algo.batch_filter),
            shapers=[create(self.registry, "reward_shaper", spec) for spec in algo.reward_shaping],
            train_set=self.train_set,  # where further generation batches draw fresh prompts
            schedule=self._setup_schedule(),
            episodes=self.episodes,
            critic=self._setup_critic(),
            kl_in_reward=self._setup_kl_in_reward(),
            teacher=self._setup_teacher(),
        )

    def _setup_schedule(self) -> loop.RolloutSchedule:
        """Rollouts at the start of each step, the next step's during this one (``rollout.overlap: 1``), or from a
        producer thread at most ``rollout.max_staleness`` weight versions ahead."""
        train_set, config, rollout = self.train_set, self.config, self.config.rollout
        prompts_for = lambda step: loop.sample_prompts(train_set, step, config)  # noqa: E731
        if rollout.max_staleness is not None:
            batch = rollout.prompts_per_step * rollout.group_size
            capacity = max(rollout.max_staleness, 1) if rollout.queue_size is None else rollout.queue_size // batch
            side = self.dist.side_group() if self.rollout_per_rank else distributed.SINGLE  # every rank, in this order
            return AsyncRollouts(
                prompts_for, config.train.steps, rollout.max_staleness, capacity, rollout.partial, side
            )
        if rollout.overlap == 0:
            return loop.RolloutSchedule()
        return OverlappedRollouts(self.trainer, prompts_for, config.train.steps)

    def _setup_learner(self) -> Learner:
        """A dense policy trains through a plain learner; an MoE policy through the router policy's replay."""
        spec = self.config.algorithm.router
        policy: RouterPolicy = create(self.registry, "router", spec) if spec is not None else RouterPolicy()
        if (
            self.trainer.moe_layout() is None
        ):  # preflight refused a replaying policy on a dense model whose config.json it could read
            if policy.replays_routing():
                raise RlzooError(
                    f"algorithm.router {spec.name!r} needs a mixture-of-experts model; this model has no MoE router"
                )
            return self._with_adapter_sync(Learner(self.trainer, self.dist))
        # R3 (preflight: the engine can record); otherwise the engine records only if its config asks (diagnostics)
        if policy.needs_rollout_routing() and (self.dist.is_main or self.rollout_per_rank):
            self.rollout.set_record_routing(True)
        return self._with_adapter_sync(RoutingLearner(self.trainer, policy, self.dist))

    def _with_adapter_sync(self, learner: Learner) -> Learner:
        """Under LoRA, whether the rollout engine receives the adapters or the merged weights, as it was started
        (``_setup_rollout``; preflight refused ``sync: adapter`` where the engine cannot)."""
        learner.sends_adapters = self.sends_adapters
        return learner

    def _setup_reference(self) -> Learner:
        """The frozen initial policy for the KL term: under LoRA the policy's own base (its adapters disabled, no
        second copy of the weights), else the initial model in another instance of the same engine."""
        if self.config.model.lora is not None:
            return Learner(self.trainer.without_adapters(), self.dist)
        reference = create(self.registry, "training_engine", self.config.trainer.engine)
        reference.start(engine_context(self.config, self.start.initial_model, self.tokenizer), self.config.trainer)
        return Learner(reference, self.dist)

    def _setup_critic(self) -> Critic | None:
        """The value model: the critic's folder or the policy's initial weights, with a value head, in its own
        instance of the training engine with the critic's optimizer settings."""
        spec = self.config.algorithm.critic
        if spec is None:
            return None
        engine = create(self.registry, "training_engine", self.config.trainer.engine)
        model_dir = Path(spec.model) if spec.model else self.start.initial_model
        context = replace(engine_context(self.config, model_dir, self.tokenizer), head="value")
        optimizer = {"lr": spec.lr, "betas": spec.betas, "weight_decay": spec.weight_decay, "grad_clip": spec.grad_clip}
        engine.start(context, self.config.trainer.model_copy(update=optimizer))
        return Critic(
            Learner(engine, self.dist),
            create(self.registry, "value_loss", spec.value_loss),
            create(self.registry, "aggregation", spec.aggregation),
            spec.warmup_steps,
        )

    def _setup_teacher(self) -> Teacher | None:
        """The frozen teacher (``teacher``): its folder in another instance of the same engine, head "lm", without
        the policy's adapters; rebuilt the same way on resume (nothing of it is checkpointed)."""
        if self.start.teacher_model is None:
            return None
        engine = create(self.registry, "training_engine", self.config.trainer.engine)
        engine.start(engine_context(self.config, self.start.teacher_model, self.tokenizer), self.config.trainer)
        return Teacher(Learner(engine, self.dist))

    def _setup_kl_in_reward(self) -> KLInReward | None:
        algo = self.config.algorithm
        if algo.kl_in_reward is None:
            return None
        return KLInReward(
            create(self.registry, "kl_controller", algo.kl_in_reward), create(self.registry, "kl", algo.kl)
        )

    def _engines_to_save(self) -> dict[str, Any]:
        """Engines checkpointed beside the policy's, each in its own sub-folder."""
        critic = self.components.critic
        return {"critic": critic.learner.engine} if critic is not None else {}

    def _state_to_save(self) -> dict[str, Any]:
        """The components' own state that a resumed run continues from (JSON)."""
        kl = self.components.kl_in_reward
        return {"kl_in_reward": kl.controller.state_dict()} if kl is not None else {}

    def _restore(self) -> int:
        if self.start.checkpoint is None:
            return 0
        state = load_checkpoint(self.start.checkpoint, self.trainer, self._engines_to_save())
        if self.components.kl_in_reward is not None and "kl_in_reward" in state:
            self.components.kl_in_reward.controller.load_state_dict(state["kl_in_reward"])
        if self.start.model_dir != self.start.checkpoint / "model":  # the rollout engine started from the base
            self.components.learner.push_weights(self.rollout, every_rank=self.rollout_per_rank)
        return state["completed_steps"]

    def run(self) -> Path:
        try:
            self.setup()
            return self._train()
        except Exception as exc:  # a component's bug: one line naming it, the traceback in the log (else as it is)
            raise component_failure(exc, self.registry, Path(self.config.output_dir), self.step) or exc  # noqa: B904 - its own cause
        finally:
            if self.folder_lock is not None:
                self.folder_lock.release()

    def _train(self) -> Path:
        config, dist, run_dir = self.config, self.dist, self.start.run_dir
        steps, completed = config.train.steps, self.completed_steps
        responses = min(config.rollout.prompts_per_step, len(self.train_set)) * config.rollout.group_size
        faults = FaultPolicy(config.train.max_consecutive_failures, responses, run_dir)
        trackers = self._setup_trackers() if dist.is_main else Trackers({})  # before the log drops replayed rows
        logger = MetricsLogger(run_dir, keep_below_step=completed) if dist.is_main else NullMetricsLogger()
        show = self.progress and dist.is_main
        bar = tqdm(
            range(completed, steps),
            initial=completed,
            total=steps,
            desc="rl",
            disable=not show,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        try:
            for step in bar:
                self.step, metrics = step, {}
                if step % config.train.eval_every == 0 and dist.is_main:  # the others go on and wait for the batch
                    metrics.update(self.evaluate())
                    trackers.log_evaluation(step, dict(metrics))  # metrics grows below
                prompts = loop.sample_prompts(self.train_set, step, config)
                metrics.update(loop.rl_step(step, prompts, self.components, config))
                logger.log(step, metrics)
                trackers.log_metrics(step, metrics)
                bar.set_postfix({k: f"{metrics[k]:.3f}" for k in PROGRESS_KEYS if k in metrics})
                faults.check(step, metrics)  # stops the run before a bad streak reaches a checkpoint
                if (step + 1) % config.train.checkpoint_every == 0 or step + 1 == steps:
                    faults.check_weights(step, {"policy": self.trainer, **self._engines_to_save()})  # never save NaN
                    keep = config.train.keep_checkpoints
                    save_checkpoint(
                        run_dir,
                        step + 1,
                        self.trainer,
                        self.tokenizer,
                        keep,
                        dist,
                        engines=self._engines_to_save(),
                        state=self._state_to_save(),
                    )
            if completed <= steps and dist.is_main:
                final = {**self.evaluate(), "final": 1.0}
                logger.log(steps, final)
                trackers.log_evaluation(steps, final)
                trackers.log_metrics(steps, final)
                if len(trackers):
                    trackers.finish({**final, "steps": float(steps)}, run_artifacts(run_dir))
        finally:
            trackers.close()
            logger.close()
            self.components.schedule.close()  # no generation in flight when the rollout engine closes
            if dist.is_main or self.rollout_per_rank:
                self.rollout.close()
        distributed.teardown(dist)
        return run_dir

    def _setup_trackers(self) -> Trackers:
        """The experiment trackers (``loggers``), told the step a resumed run starts from."""
        resumed_at = self.completed_steps if self.start.checkpoint is not None else None
        return start_trackers(self.config, self.registry, self.start.run_dir, resumed_at)

    def evaluate(self) -> dict[str, float]:
        with self.components.schedule.paused():  # a producer thread shares the rollout engine
            return loop.evaluate(self.eval_set, self.rollout, self.verifier, self.tokenizer, self.config, self.episodes)
