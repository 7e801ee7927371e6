"""The critic: a value model trained beside the policy (PPO with a learned baseline), on the run's training engine.

    old values <- critic on the rollout batch, no gradient                         (time/critic)
    advantages, returns <- the advantage source (gae) from token rewards and old values
    each of the step's minibatches (the policy's rows), after the policy's update:
        loss <- aggregation(value_loss(values, old values, returns, mask))          (time/train)
        the critic's engine takes one optimizer step

The critic is the model of ``algorithm.critic.model`` (null: the policy's initial weights) with a scalar head
(``EngineContext.head = "value"``), started in its own instance of ``trainer.engine`` with the critic's optimizer
settings, so it trains in micro-batches, under ZeRO and across processes exactly as the policy does. Its value of
response token t is its output at the position that predicts t: the state before the token (verl's critic).

Metrics: ``critic/value_mean`` and ``critic/explained_variance`` (``1 - Var(returns - values) / (Var(returns) + 1e-5)`` over
the batch's response tokens, before the update: how much of the return the critic already predicts),
``critic/vf_loss`` and ``critic/vf_clipfrac`` (the minibatches' mean), and the critic engine's own step metrics
under ``critic/`` (``critic/grad_norm``, ``critic/nonfinite_steps``, ...; declared types kept, so the fault policy
counts a critic's skipped update like the policy's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlzoo.engines import TokenBatch
from rlzoo.engines.device import to_device
from rlzoo.episodes.rules import policy_vocab
from rlzoo.interfaces import LossAggregation, Problem, RunFacts, ValueLoss
from rlzoo.interfaces.base import collecting
from rlzoo.models.folder import MISSING, NOT_A_MODEL_FOLDER, ModelFolder, config_facts
from rlzoo.models.tokenizer import vocab_difference
from rlzoo.rl.learner import Learner
from rlzoo.util.tensors import masked_mean


@dataclass
class Critic:
    """Values of a rollout batch and minibatch updates of the value loss, over the run's processes."""

    learner: Learner  # the critic's training engine (head "value") and the run's processes
    value_loss: ValueLoss
    aggregation: LossAggregation
    warmup_steps: int = 0

    def values(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` values of every row (0 at masked positions), without gradient."""
        values = self.learner.values(batch)
        return torch.where(batch.response_mask > 0, values, torch.zeros_like(values))

    def update(
        self, batch: TokenBatch, rows: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor
    ) -> dict[str, float]:
        """One optimizer step of the critic on ``batch[rows]`` towards ``returns``."""
        here = batch.response_mask[rows], old_values[rows], returns[rows]

        def loss_fn(values: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            # on the values' device; the metrics stay there until the step reads them all at once
            mask, old, targets = (to_device(t, values.device).to(values.dtype) for t in here)
            keep = mask > 0
            with collecting() as reports:  # what the value loss report()ed during this call
                result = self.value_loss.loss(values, old, targets, mask)
            per_token = torch.where(keep, result.per_token, torch.zeros_like(result.per_token))
            loss = self.aggregation.aggregate(per_token, mask)
            clipped = (result.clipped & keep).to(values.dtype)
            metrics = {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": masked_mean(clipped, mask), **reports}
            return loss, metrics

        engine_metrics = self.learner.update(batch, rows, loss_fn)
        return {_critic_key(key): value for key, value in engine_metrics.items()}

    def step_metrics(self) -> dict[str, float]:
        """What the critic's engine reported outside its updates (the values pass), keyed as in its updates."""
        return {_critic_key(key): value for key, value in self.learner.step_metrics().items()}


def _critic_key(key: str) -> str:
    """The critic engine's ``train/grad_norm`` is ``critic/grad_norm``; the loss's own ``critic/*`` stay; what the
    engine reported (``training_engine/<name>/<metric>``) is ``critic/training_engine/<name>/<metric>``."""
    if key.startswith("critic/"):
        return key
    if key.startswith("training_engine/"):
        return "critic/" + key
    return "critic/" + key.split("/", 1)[1] if key.startswith("train/") else "critic/" + key.replace("/", "_")


@torch.no_grad()
def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``critic/value_mean`` and ``critic/explained_variance`` of a batch, before the critic's update."""
    keep = mask > 0
    v, r = values[keep].double(), returns[keep].double()
    # verl's critic/vf_explained_var: unbiased variances, 1e-5 beside the returns' variance
    explained = 1.0 - torch.var(r - v) / (torch.var(r) + 1e-5) if r.numel() > 1 else torch.tensor(0.0)
    return {"critic/value_mean": masked_mean(values, mask).item(), "critic/explained_variance": explained.item()}


def critic_rule(run: RunFacts) -> list[Problem]:
    """A critic (``algorithm.critic``) runs on a training engine that can train values, learns the returns of an
    advantage source that reads values, and (from a folder of its own) is the policy's kind of model: dense or
    MoE as the policy (one engine configuration, e.g. DeepSpeed-MoE, serves both), over the same token ids.
    A critic never needs the policy's old-log-prob pass: it runs its own, so ``old_logprobs: rollout-only`` stays
    possible."""
    critic, config = run.config.algorithm.critic, run.config
    if critic is None:
        return []
    problems: list[Problem] = []
    engine = run.registry.get("training_engine", config.trainer.engine.name).cls
    if not engine.trains_values:
        usable = run.names("training_engine", lambda cls: cls.trains_values)
        problems.append(
            (
                "trainer.engine.name",
                f"{engine.name!r} cannot train a critic (algorithm.critic) (trains_values is false); use one of {usable}",
            )
        )
    # the constructed source: one that nests another (reverse-kl) reads what the nested one reads
    advantage = run.components.get("algorithm.advantage")
    advantage = advantage or run.registry.get("advantage", config.algorithm.advantage.name).cls
    if not advantage.needs_values:
        usable = run.names("advantage", lambda cls: cls.needs_values)
        problems.append(
            (
                "algorithm.critic",
                f"advantage {advantage.name!r} reads no values and gives the critic no returns to learn; use an advantage "
                f"that does ({', '.join(usable)}), or critic: null",
            )
        )
    if critic.model is None:
        return problems
    return problems + _critic_folder_problems(run, Path(critic.model))


def _critic_folder_problems(run: RunFacts, path: Path) -> list[Problem]:
    """The critic's own folder: a model folder with weights, of the policy's kind and ``vocab_size``."""
    loc, folder = "algorithm.critic.model", ModelFolder.read(path)
    if folder.absent is not None:
        what = MISSING if folder.absent == MISSING else NOT_A_MODEL_FOLDER
        return [(loc, f"{path} {what}; name a model folder, or null for a copy of the policy")]
    if folder.config is None:
        return [(loc, str(folder.unreadable))]
    problems = [(loc, message) for message in folder.problems(head="value")]
    moe = config_facts(folder.config).moe  # a bool: a config.json says MoE or dense
    if run.model.moe is not None and moe is not None and moe != run.model.moe:
        kinds = {True: "a mixture-of-experts", False: "a dense"}
        problems.append(
            (
                loc,
                f"{path} is {kinds[moe]} model but the policy is {kinds[run.model.moe]} one: the critic trains on "
                "the policy's engine configuration; use a critic of the policy's kind, or null for a copy of the policy",
            )
        )
    return problems + _critic_tokenizer_problems(run, path, folder, folder.config.get("vocab_size"))


def _critic_tokenizer_problems(run: RunFacts, path: Path, folder: ModelFolder, vocab_size: Any) -> list[Problem]:
    """The critic reads the policy's token ids, whatever the policy: its folder has the policy's ``vocab_size`` and,
    where both are known, the policy's tokenizer (a folder policy's ``tokenizer.json``, or the character tokenizer a
    tiny policy is built on from the task's alphabet); ``vocab_size``: the folder's config.json's."""
    loc, problems = "algorithm.critic.model", []
    policy, source = policy_vocab(run)
    if run.model.tiny:  # model.tiny's vocab_size is a bound: the embedding has one row per token of the tokenizer
        size, whose = (len(policy) if policy is not None else None), source
    else:
        size, whose = (run.model.shape.vocab if run.model.shape is not None else None), "model.path"
    if size is not None and vocab_size != size:
        problems.append(
            (
                loc,
                f"{path} has vocab_size {vocab_size} but the policy {size} ({whose}): the critic "
                "reads the policy's token ids; use a critic built on the policy's tokenizer",
            )
        )
    critic = folder.vocab()[0] if folder.tokenizer_file.is_file() else None  # unreadable: nothing to compare
    if critic is None or policy is None:
        return problems
    if (mismatch := vocab_difference(critic, policy, "critic")) is not None:
        problems.append(
            (
                loc,
                f"the tokenizer of {path} differs from the policy's ({source}): {mismatch}; the critic reads the "
                "policy's token ids: use a critic built on the policy's tokenizer",
            )
        )
    return problems
