"""The critic's parts: a training engine started with a value head, the Critic's passes and updates, the KL in the
reward, and the per-token rewards GAE reads."""

from __future__ import annotations

import pytest
import torch

from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.interfaces import KLController, ValueLoss, ValueLossResult
from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model
from rlzoo.registry import default_registry
from rlzoo.rl.critic import Critic, value_metrics
from rlzoo.rl.learner import Learner
from rlzoo.rl.reward_kl import KLInReward
from rlzoo.rl.rollouts import token_level_rewards

TOKENIZER = build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3"])
def policy_dir(request, tmp_path_factory):
    tiny = TinyModelConfig(
        architecture=request.param,
        hidden_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=64,
    )
    return save_model(build_tiny_model(tiny, TOKENIZER), TOKENIZER, tmp_path_factory.mktemp(request.param) / "m")


def _critic_engine(model_dir, **trainer) -> TorchTrainingEngine:
    engine = TorchTrainingEngine()
    engine.start(
        EngineContext(model_dir, pad_token_id=0, eos_token_id=1, seed=3, head="value"), TrainerConfig(**trainer)
    )
    return engine


def _batch():
    prompts = ["1+2=", "12+2=", "7+7=", "3+45="]
    answers = ["3", "14", "14", "48"]
    return make_token_batch(
        [TOKENIZER(p)["input_ids"] for p in prompts], [TOKENIZER(a)["input_ids"] + [1] for a in answers], 0
    )


def test_a_critic_is_the_policy_with_a_seeded_value_head(policy_dir):
    critic = _critic_engine(policy_dir)
    policy, _ = load_model(policy_dir)
    backbone = {k: v for k, v in policy.state_dict().items() if k.startswith("model.")}
    values = critic.model.state_dict()
    assert backbone and all(torch.equal(values[k], v) for k, v in backbone.items())  # the policy's weights
    assert critic.model.score.weight.shape == (1, policy.config.hidden_size)  # one value per position
    again = _critic_engine(policy_dir)
    assert torch.equal(again.model.score.weight, critic.model.score.weight)  # the head comes from the seed


@pytest.mark.parametrize("budget,packing", [(10_000, True), (8, False), (8, True)])
def test_values_are_the_head_at_the_position_before_each_response_token(policy_dir, budget, packing):
    critic = _critic_engine(policy_dir, max_tokens_per_micro_batch=budget, packing=packing)
    batch = _batch()
    values = critic.values(batch)
    with torch.no_grad():
        out = critic.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[..., 0]
    for row in range(len(values)):
        start, length = int(batch.response_start[row]), int(batch.response_mask[row].sum())
        assert torch.allclose(values[row, :length], out[row, start - 1 : start - 1 + length], atol=1e-5)
        assert torch.all(values[row, length:] == 0)


class _Squared(ValueLoss):
    name = "squared-test"

    def loss(self, values, old_values, returns, mask):
        return ValueLossResult(0.5 * (values - returns) ** 2, values > returns)


def test_critic_updates_regress_the_values_onto_the_returns(policy_dir):
    batch = _batch()
    mask = batch.response_mask
    critic = Critic(
        Learner(_critic_engine(policy_dir, lr=1e-2, max_tokens_per_micro_batch=12)),
        _Squared(),
        default_registry().create("aggregation", "token-mean"),
    )
    returns = torch.tensor([[1.0, 0.5, 0.0], [-1.0, 0.0, 2.0], [0.3, 0.3, 0.3], [1.0, 1.0, -1.0]])[:, : mask.shape[1]]
    returns = returns * mask
    before = critic.values(batch)
    rows = torch.arange(len(mask))
    first = critic.update(batch, rows, before, returns)
    for _ in range(40):
        last = critic.update(batch, rows, before, returns)
    assert last["critic/vf_loss"] < 0.1 * first["critic/vf_loss"]
    # the loss the critic reports is the aggregated value loss of the values it had before the step
    expected = (0.5 * (before - returns) ** 2 * mask).sum() / mask.sum()
    assert first["critic/vf_loss"] == pytest.approx(expected.item(), rel=1e-4)
    # the engine's step metrics are the critic's, with their declared types (the fault policy reads those)
    assert {"critic/grad_norm", "critic/nonfinite_steps"} <= set(first) and "train/grad_norm" not in first
    assert type(first["critic/nonfinite_steps"]).__name__ == "SkippedUpdates"
    assert value_metrics(critic.values(batch), returns, mask)["critic/explained_variance"] > 0.8
    assert value_metrics(before, returns, mask)["critic/explained_variance"] < 0.5


def test_explained_variance_is_verls():
    values = torch.tensor([[0.5, 0.1, 9.0], [0.2, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 0.0, -3.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    r, v = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, 0.1, 0.2])
    expected = 1 - torch.var(r - v) / (torch.var(r) + 1e-5)  # verl's compute_data_metrics
    metrics = value_metrics(values, returns, mask)
    assert metrics["critic/explained_variance"] == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["critic/value_mean"] == pytest.approx(0.8 / 3, rel=1e-6)


class _Halving(KLController):
    name = "halving-test"

    def __init__(self, params=None):
        super().__init__(params)
        self.value, self.seen = 0.5, []

    @property
    def coef(self):
        return self.value

    def update(self, current_kl, n_steps):
        self.seen.append((current_kl, n_steps))
        self.value /= 2


def test_kl_in_reward_is_verls_apply_kl_penalty():
    g = torch.Generator().manual_seed(0)
    old, ref = -torch.rand(3, 4, generator=g) * 2, -torch.rand(3, 4, generator=g) * 2
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 1]])  # row 2: a masked observation
    scores = torch.zeros(3, 4)
    scores[0, 2], scores[1, 1], scores[2, 3] = 1.0, 0.0, 0.5
    old[0, 3], ref[2, 1] = float("-inf"), float("nan")  # padding and observations may hold anything
    controller = _Halving()
    kl = KLInReward(controller, default_registry().create("kl", "k1"))
    penalised, metrics = kl.penalise(scores, old, ref, mask)
    kld = torch.where(mask > 0, old - ref, torch.zeros_like(old))  # verl: kl_penalty(old, ref, "kl") * mask
    assert torch.allclose(penalised, scores - 0.5 * kld)
    per_response = kld.sum(-1) / mask.sum(-1)
    assert metrics["kl/coef"] == 0.5 and metrics["kl/in_reward"] == pytest.approx(per_response.mean().item())
    assert controller.seen == [(pytest.approx(per_response.mean().item()), 3)] and controller.coef == 0.25
    assert torch.isfinite(penalised).all()


def test_token_rewards_sit_at_each_steps_last_policy_token():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 0, 0, 1], [0, 0, 0, 0, 0]])
    out = token_level_rewards([[1.0], [0.25, 2.0], [3.0]], [[3], [2, 3], [1]], mask)
    expected = torch.zeros(3, 5)
    expected[0, 2], expected[1, 1], expected[1, 4] = 1.0, 0.25, 2.0  # row 1: the observation at 2..3 is skipped
    assert torch.equal(out, expected)  # row 2 has no policy token to carry its reward
