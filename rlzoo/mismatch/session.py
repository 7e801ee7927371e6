"""The measurement: a run built from the config as ``rlzoo train`` builds it (:class:`rlzoo.runtime.run.TrainingRun`'s
set-up steps, engines included), then ``N`` rollout batches sampled and scored under the same weights.

Per batch, the phases of :func:`rlzoo.rl.loop.rl_step` up to the advantages, unchanged::

    rollout_batch   the config's prompts sampled by its rollout engine (every group kept: no batch filter)
    old_pass        the same tokens scored by its training engine (MoE: under the config's router policy)
    teacher, critic, advantages   as a step computes them (the corrections' ``keep`` reads the advantages)

MoE policies also get one pass routed afresh when the router policy replays experts in the old pass (R3), and the
experts each pass chose are compared per MoE layer with the rollout engine's (:func:`rlzoo.moe.flip_counts`; the
rollout engine is asked to record them when it can). Each side's precision is the config's: ``model.dtype`` the
rollout engine's, ``trainer.dtype`` the training engine's (bf16 autocast over fp32 weights).

What :class:`Asked` adds, all under the same weights unless said:

    alone        the first batch's rows each scored by the trainer alone (batch composition)
    corrections  per batch, the policy gradient of each minibatch under each correction and the on-policy one
                 (:mod:`rlzoo.mismatch.gradients`), when the training engine computes gradients
    stale        after the N batches, k = 1, 2, ... real updates of the config's algorithm (the phases of
                 :func:`rlzoo.rl.loop.rl_step` up to and with ``minibatch_updates``, on batches of the next steps'
                 prompts, sampled by the rollout engine under the measured weights: as a producer k versions ahead
                 samples them), the rollout engine's weights left where they were; after update k, the N measured
                 batches scored again by the trainer: their gap is k versions of staleness. The updated weights
                 live only in this process: they are never pushed to the rollout engine, saved or checkpointed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines.tokens import select_rows
from rlzoo.errors import RlzooError
from rlzoo.interfaces import BatchFilter, MismatchCorrection, RecordedRouting
from rlzoo.interfaces.base import collecting
from rlzoo.mismatch.gradients import GradientMeasure
from rlzoo.moe import flip_counts
from rlzoo.registry import Registry
from rlzoo.rl import loop
from rlzoo.rl.advantages import advantages
from rlzoo.rl.routing_learner import RoutingLearner
from rlzoo.rl.step_record import StepRecord, filled
from rlzoo.runtime import distributed
from rlzoo.runtime.cold_start import cold_start_dir
from rlzoo.runtime.faults import component_failure
from rlzoo.runtime.run import TrainingRun
from rlzoo.util.reductions import reduce_minibatches
from rlzoo.util.seeds import Stream, step_seed


@dataclass
class Measured:
    """Every measured batch's response tokens, rows concatenated (``[R, T]``), and the MoE expert comparisons."""

    train: torch.Tensor  # the training engine's log-probs (MoE: under the config's router policy)
    rollout: torch.Tensor  # the rollout engine's
    mask: torch.Tensor
    advantages: torch.Tensor
    fresh: torch.Tensor | None = None  # MoE whose policy replays in the old pass: the training engine routing afresh
    flips: dict[int, list[int]] = field(default_factory=dict)  # layer -> [differing slots, slots]: fresh vs rollout
    flips_policy: dict[int, list[int]] = field(default_factory=dict)  # the same under the policy's old-pass routing
    router_policy: str | None = None
    replays_old_pass: bool = False  # the router policy replays experts in the old pass (R3): ``fresh`` differs
    alone: torch.Tensor | None = None  # with ``alone``: the first batch's rows each scored by the trainer alone
    alone_batched: torch.Tensor | None = None  # the same rows scored in the full batch, routed the same way
    gradients: dict[str, dict[str, float]] | None = None  # with corrections: by estimator (rlzoo.mismatch.gradients)
    gradients_about: dict[str, object] = field(default_factory=dict)  # what they were measured on, or why not
    stale: dict[int, torch.Tensor] = field(default_factory=dict)  # k -> the rows' train log-probs k updates on
    stale_grad_norm: dict[int, float] = field(default_factory=dict)  # k -> update k's mean gradient norm
    batches: int = 0
    skipped: int = 0  # batches whose every response was empty
    seconds: float = 0.0


@dataclass
class Asked:
    """What a measurement adds to the gap of its batches (module docstring)."""

    alone: bool = False
    corrections: Mapping[str, MismatchCorrection] | None = None
    stale: tuple[int, ...] = ()


def measurement_config(config: RunConfig, out: Path) -> RunConfig:
    """``config`` as the measurement runs it: in ``out``, the cold start where the config's run keeps it, each
    batch sampled in the loop (no overlap, no producer thread)."""
    cold = config.cold_start.model_copy(update={"output_dir": str(cold_start_dir(config))})
    rollout = config.rollout.model_copy(update={"overlap": 0, "max_staleness": None, "partial": "off"})
    return config.model_copy(update={"output_dir": str(out), "cold_start": cold, "rollout": rollout})


class MismatchRun(TrainingRun):
    """A training run's set-up, then :meth:`measure` instead of training."""

    def __init__(self, config: RunConfig, registry: Registry, asked: Asked | None = None) -> None:
        super().__init__(config, registry)
        self.asked = asked or Asked()

    def measure(self, steps: int, tick: Callable[[int], None] = lambda n: None) -> Measured:
        """``steps`` batches sampled and scored under the same weights (module docstring); ``tick(0)`` once the run is
        set up, ``tick(1)`` after each batch."""
        c, config = self.components, self.config
        c.batch_filter = BatchFilter()  # every group counts
        learner = c.learner if isinstance(c.learner, RoutingLearner) else None
        if learner is not None and self.rollout.can_record_routing:
            self.rollout.set_record_routing(True)
        parts: dict[str, list[torch.Tensor]] = {"train": [], "rollout": [], "mask": [], "advantages": [], "fresh": []}
        measured = Measured(*(torch.empty(0),) * 4, router_policy=(learner.policy.name or "none") if learner else None)
        gradients = self._gradients_setup(measured)
        since = time.perf_counter()
        tick(0)  # set up: the measurement starts
        records = []
        for step in range(steps):
            record = self._batch(step)
            measured.batches += 1
            if record is None:
                measured.skipped += 1
                tick(1)
                continue
            records.append(record)
            old, batch = filled(record.old, "old"), filled(record.batch, "batch")
            train = filled(old.train, "old.train")
            parts["train"].append(train)
            parts["rollout"].append(old.rollout)
            parts["mask"].append(batch.response_mask)
            parts["advantages"].append(filled(record.advantages, "advantages"))
            fresh = self._compare_routing(learner, record, measured) if learner is not None else train
            parts["fresh"].append(fresh)
            if self.asked.alone and measured.alone is None:
                alone = [c.learner.logprobs(select_rows(batch, torch.tensor([i]))) for i in range(len(fresh))]
                measured.alone, measured.alone_batched = torch.cat(alone), fresh
            if gradients is not None:  # under the measured weights, the learner replaying as this batch's update would
                gradients.add(record, c, config)
            tick(1)
        if not parts["train"]:
            raise RlzooError(f"mismatch: none of the {steps} batch(es) held a response token; nothing to measure")
        if gradients is not None:
            measured.gradients, measured.gradients_about = gradients.effects(), gradients.about()
        if self.asked.stale:
            self._stale(records, steps, measured, tick)
        measured.seconds = time.perf_counter() - since
        widest = max(t.shape[-1] for t in parts["mask"])
        cat = {k: torch.cat([_pad(t.detach().cpu().float(), widest) for t in v]) for k, v in parts.items() if v}
        measured.train, measured.rollout, measured.mask = cat["train"], cat["rollout"], cat["mask"]
        measured.advantages = cat["advantages"]
        if measured.replays_old_pass:
            measured.fresh = cat["fresh"]
        if measured.alone is not None and measured.alone_batched is not None:
            measured.alone = _pad(measured.alone.detach().cpu().float(), widest)
            measured.alone_batched = _pad(measured.alone_batched.detach().cpu().float(), widest)
        measured.stale = {k: _pad(t, widest) for k, t in measured.stale.items()}
        return measured

    def _batch(self, step: int) -> StepRecord | None:
        """Step ``step``'s batch sampled by the rollout engine and taken through the phases of a step up to the
        advantages (the training engine's old pass, whatever ``algorithm.old_logprobs`` says); ``None`` when no
        response holds a token."""
        c = self.components
        record = StepRecord(step)
        prompts = loop.sample_prompts(self.train_set, step, self.config)
        record.rollout = loop.rollout_batch(record, prompts, c, c.rollout_parts(self.config))
        if record.batch is None or not bool(record.batch.response_mask.any()):
            return None
        loop.old_pass(record, c, "train")
        record.teacher_logp = c.teacher.logprobs(record.batch) if c.teacher is not None else None
        record.values = c.critic.values(record.batch) if c.critic is not None else None
        advantages(record, c.advantage, c.kl_in_reward)
        return record

    def _gradients_setup(self, measured: Measured) -> GradientMeasure | None:
        """The corrections' gradients' measure, when they are asked for and the training engine computes them (else
        why not, in ``measured.gradients_about``)."""
        if self.asked.corrections is None:
            return None
        why_not = self.trainer.gradients_unavailable()
        if why_not is not None:
            measured.gradients_about = {"unavailable": why_not}
            return None
        seed = step_seed(self.config.seed, 0, Stream.GRADIENT_SKETCH)
        horizon = self.config.train.steps * self.config.algorithm.minibatches_per_rollout  # the run's optimizer steps
        return GradientMeasure(self.asked.corrections, seed, horizon)

    def _stale(self, records: list[StepRecord], steps: int, into: Measured, tick: Callable[[int], None]) -> None:
        """``into.stale``: the measured batches' train log-probs after k = 1 .. max(stale) real updates (module
        docstring), for each k asked; ``into.stale_grad_norm``: each update's mean gradient norm (0: its batch held
        no learning signal, every group's rewards equal). The updates are the steps after the measured ones (and
        after a critic's warm-up, so that the policy learns), their batches sampled under the measured weights."""
        c, config = self.components, self.config
        first = steps + (c.critic.warmup_steps if c.critic is not None else 0)
        for k in range(1, max(self.asked.stale) + 1):
            record = self._batch(first + k - 1)
            if record is not None:
                with collecting():  # the update's reports: no step's metrics
                    loop.minibatch_updates(record, c, config)
            norms = reduce_minibatches(record.updates) if record is not None else {}
            into.stale_grad_norm[k] = float(norms.get("train/grad_norm", 0.0))
            if k in self.asked.stale:
                scored = []
                for measured in records:
                    batch, rollout = filled(measured.batch, "batch"), filled(measured.rollout, "rollout")
                    routings = [g.routing for g in rollout.generations]
                    logp = c.learner.old_logprobs(batch, rollout.rollout_logp, routings)[0]
                    scored.append(logp.detach().cpu().float())
                widest = max(t.shape[-1] for t in scored)
                into.stale[k] = torch.cat([_pad(t, widest) for t in scored])
            tick(1)

    def _compare_routing(self, learner: RoutingLearner, record: StepRecord, measured: Measured) -> torch.Tensor:
        """The batch's log-probs routed afresh (the old pass's when the policy did not replay there), and each MoE
        layer's expert disagreement with the rollout engine: routed afresh, and as the old pass routed."""
        batch, recorded = filled(record.batch, "batch"), learner.recorded
        replayed = learner.policy.old_pass_routing(RecordedRouting(old=None, rollout=recorded.rollout)) is not None
        measured.replays_old_pass = replayed
        if replayed:
            with self.trainer.routing_pass(None) as used:
                fresh_logp = learner.logprobs(batch)
            fresh = filled(used.routing, "routing")
        else:
            fresh_logp, fresh = (
                filled(filled(record.old, "old").train, "old.train"),
                filled(recorded.old, "old routing"),
            )
        if recorded.rollout is None:
            return fresh_logp
        for layer in learner.layout.layers:
            rollout = recorded.rollout.only_layers([layer])
            _add(measured.flips, layer, flip_counts(rollout, fresh.only_layers([layer]), batch.attention_mask))
            if replayed:
                policy = filled(recorded.old, "old routing").only_layers([layer])
                _add(measured.flips_policy, layer, flip_counts(rollout, policy, batch.attention_mask))
        return fresh_logp

    def close(self) -> None:
        """The rollout engine closed and the run folder released (also after a failed set-up)."""
        if getattr(self, "components", None) is not None:
            self.components.schedule.close()
        if getattr(self, "rollout", None) is not None and getattr(self, "start", None) is not None:
            self.rollout.close()
        if self.folder_lock is not None:
            self.folder_lock.release()


def measure_config(
    config: RunConfig,
    registry: Registry,
    steps: int,
    tick: Callable[[int], None] = lambda n: None,
    asked: Asked | None = None,
) -> Measured:
    """Build the measurement run of ``config`` (already :func:`measurement_config`) and measure ``steps`` batches
    and what ``asked`` adds; a component's exception as one line naming it, as ``rlzoo train`` reports it."""
    if distributed.launched_world_size() > 1:
        raise RlzooError("rlzoo mismatch runs in one process; start it without torchrun / deepspeed")
    run = MismatchRun(config, registry, asked)
    try:
        run.setup()
        return run.measure(steps, tick)
    except RlzooError:
        raise
    except Exception as exc:
        raise component_failure(exc, registry, Path(config.output_dir), None) or exc  # noqa: B904 - its own cause
    finally:
        run.close()


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t


def _add(into: dict[int, list[int]], layer: int, counts: tuple[int, int]) -> None:
    total = into.setdefault(layer, [0, 0])
    total[0] += counts[0]
    total[1] += counts[1]
