"""The measurement: a run built from the config as ``rlzoo train`` builds it (:class:`rlzoo.runtime.run.TrainingRun`'s
set-up steps, engines included), then ``N`` rollout batches sampled and scored under the same weights, no update.

Per batch, the phases of :func:`rlzoo.rl.loop.rl_step` up to the advantages, unchanged::

    rollout_batch   the config's prompts sampled by its rollout engine (every group kept: no batch filter)
    old_pass        the same tokens scored by its training engine (MoE: under the config's router policy)
    teacher, critic, advantages   as a step computes them (the corrections' ``keep`` reads the advantages)

MoE policies also get one pass routed afresh when the router policy replays experts in the old pass (R3), and the
experts each pass chose are compared per MoE layer with the rollout engine's (:func:`rlzoo.moe.flip_counts`; the
rollout engine is asked to record them when it can). Each side's precision is the config's: ``model.dtype`` the
rollout engine's, ``trainer.dtype`` the training engine's (bf16 autocast over fp32 weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines.tokens import select_rows
from rlzoo.errors import RlzooError
from rlzoo.interfaces import BatchFilter, RecordedRouting
from rlzoo.moe import flip_counts
from rlzoo.registry import Registry
from rlzoo.rl import loop
from rlzoo.rl.advantages import advantages
from rlzoo.rl.routing_learner import RoutingLearner
from rlzoo.rl.step_record import StepRecord
from rlzoo.runtime import distributed
from rlzoo.runtime.cold_start import cold_start_dir
from rlzoo.runtime.faults import component_failure
from rlzoo.runtime.run import TrainingRun


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
    batches: int = 0
    skipped: int = 0  # batches whose every response was empty
    seconds: float = 0.0


def measurement_config(config: RunConfig, out: Path) -> RunConfig:
    """``config`` as the measurement runs it: in ``out``, the cold start where the config's run keeps it, each
    batch sampled in the loop (no overlap, no producer thread)."""
    cold = config.cold_start.model_copy(update={"output_dir": str(cold_start_dir(config))})
    rollout = config.rollout.model_copy(update={"overlap": 0, "max_staleness": None, "partial": "off"})
    return config.model_copy(update={"output_dir": str(out), "cold_start": cold, "rollout": rollout})


class MismatchRun(TrainingRun):
    """A training run's set-up, then :meth:`measure` instead of training."""

    def __init__(self, config: RunConfig, registry: Registry, alone: bool = False) -> None:
        super().__init__(config, registry)
        self.alone = alone  # also score the first batch's rows one at a time (batch composition)

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
        since = time.perf_counter()
        tick(0)  # set up: the measurement starts
        for step in range(steps):
            record = StepRecord(step)
            prompts = loop.sample_prompts(self.train_set, step, config)
            record.rollout = loop.rollout_batch(record, prompts, c, c.rollout_parts(config))
            measured.batches += 1
            if record.batch is None or not bool(record.batch.response_mask.any()):
                measured.skipped += 1
                tick(1)
                continue
            loop.old_pass(record, c, "train")  # whatever algorithm.old_logprobs says: the training engine's pass
            record.teacher_logp = c.teacher.logprobs(record.batch) if c.teacher is not None else None
            record.values = c.critic.values(record.batch) if c.critic is not None else None
            advantages(record, c.advantage, c.kl_in_reward)
            old, batch = record.old, record.batch
            parts["train"].append(old.train)
            parts["rollout"].append(old.rollout)
            parts["mask"].append(batch.response_mask)
            parts["advantages"].append(record.advantages)
            fresh = self._compare_routing(learner, record, measured) if learner is not None else old.train
            parts["fresh"].append(fresh)
            if self.alone and measured.alone is None:
                alone = [c.learner.logprobs(select_rows(batch, torch.tensor([i]))) for i in range(len(fresh))]
                measured.alone, measured.alone_batched = torch.cat(alone), fresh
            tick(1)
        measured.seconds = time.perf_counter() - since
        if not parts["train"]:
            raise RlzooError(f"mismatch: none of the {steps} batch(es) held a response token; nothing to measure")
        widest = max(t.shape[-1] for t in parts["mask"])
        cat = {k: torch.cat([_pad(t.detach().cpu().float(), widest) for t in v]) for k, v in parts.items() if v}
        measured.train, measured.rollout, measured.mask = cat["train"], cat["rollout"], cat["mask"]
        measured.advantages = cat["advantages"]
        if measured.replays_old_pass:
            measured.fresh = cat["fresh"]
        if measured.alone is not None:
            measured.alone = _pad(measured.alone.detach().cpu().float(), widest)
            measured.alone_batched = _pad(measured.alone_batched.detach().cpu().float(), widest)
        return measured

    def _compare_routing(self, learner: RoutingLearner, record: StepRecord, measured: Measured) -> torch.Tensor:
        """The batch's log-probs routed afresh (the old pass's when the policy did not replay there), and each MoE
        layer's expert disagreement with the rollout engine: routed afresh, and as the old pass routed."""
        batch, recorded = record.batch, learner.recorded
        replayed = learner.policy.old_pass_routing(RecordedRouting(old=None, rollout=recorded.rollout)) is not None
        measured.replays_old_pass = replayed
        if replayed:
            with self.trainer.routing_pass(None) as used:
                fresh_logp = learner.logprobs(batch)
            fresh = used.routing
        else:
            fresh_logp, fresh = record.old.train, recorded.old
        if recorded.rollout is None:
            return fresh_logp
        for layer in learner.layout.layers:
            rollout = recorded.rollout.only_layers([layer])
            _add(measured.flips, layer, flip_counts(rollout, fresh.only_layers([layer]), batch.attention_mask))
            if replayed:
                _add(
                    measured.flips_policy,
                    layer,
                    flip_counts(rollout, recorded.old.only_layers([layer]), batch.attention_mask),
                )
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
    alone: bool = False,
) -> Measured:
    """Build the measurement run of ``config`` (already :func:`measurement_config`) and measure ``steps`` batches; a
    component's exception as one line naming it, as ``rlzoo train`` reports it."""
    if distributed.launched_world_size() > 1:
        raise RlzooError("rlzoo mismatch runs in one process; start it without torchrun / deepspeed")
    run = MismatchRun(config, registry, alone)
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
