"""What the schedule tests (test_overlap.py, test_async_rollouts.py) watch: a reward that varies with every character,
the hf engine remembering the weights each generation sampled with, and weight-state comparisons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.config.schema import RunConfig, TinyModelConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, rl_step, sample_prompts
from rlzoo.rl.objective import build_objective
from rlzoo.rl.schedule import RolloutSchedule


class CharSum(Verifier):
    """A reward that varies with every character, so the responses of a group differ and every step updates."""

    name = "char-sum"

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(float(sum(map(ord, response)) % 5))


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


class WatchedRollout(HFRolloutEngine):
    """The hf engine, remembering the weights each generate() call sampled with (``sampled_with``)."""

    def generate(self, prompts, sampling):
        self.sampled_with.append(state(self.model))
        return super().generate(prompts, sampling)


@dataclass
class Rig:
    """A tiny MoE on the torch trainer and a watched hf engine, with a run config and sums as prompts."""

    config: RunConfig
    trainer: TorchTrainingEngine
    rollout: WatchedRollout
    tokenizer: Any
    train_set: list[Sample]

    def prompts_for(self, step: int) -> list[Sample]:
        return sample_prompts(self.train_set, step, self.config)

    def run(self, learner: Learner, schedule: RolloutSchedule) -> list[dict[str, float]]:
        """Every step of the config through ``rl_step`` with ``learner`` and ``schedule`` (closed afterwards)."""
        registry = default_registry()
        c = Components(
            objective=build_objective(self.config.algorithm, registry),
            advantage=registry.create("advantage", "group"),
            verifier=CharSum(),
            correction=registry.create("correction", "none"),
            rollout=self.rollout,
            learner=learner,
            tokenizer=self.tokenizer,
            train_set=self.train_set,
            schedule=schedule,
        )
        try:
            return [rl_step(step, self.prompts_for(step), c, self.config) for step in range(self.config.train.steps)]
        finally:
            schedule.close()


def start_rig(tmp_path, steps: int, **rollout: Any) -> Rig:
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    config = RunConfig.model_validate(
        {
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4, **rollout},
            "trainer": {"lr": 3e-2},
            "algorithm": {"minibatches_per_rollout": 2},
            "train": {"steps": steps},
        }
    )
    context = EngineContext(tmp_path / "m", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    trainer = TorchTrainingEngine()
    trainer.start(context, config.trainer)
    engine = WatchedRollout()
    engine.start(context)
    engine.sampled_with = []
    train_set = [Sample(f"{a}+{b}=", str(a + b)) for a in range(5) for b in range(5)]
    return Rig(config, trainer, engine, tokenizer, train_set)
