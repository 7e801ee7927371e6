"""The teacher of on-policy distillation: its log-probs are a direct forward of its model, the loop logs the reverse
KL and times the teacher's pass, the advantage source receives both log-probs, the tiny teacher's cold start has a
folder and fingerprint of its own."""

from __future__ import annotations

import pytest
import torch
from test_metrics_reporting import NoModelLearner
from test_stages_loop import ByPrompt, CharTokenizer, IsA  # the loop tests' fake engine, tokenizer, verifier

from rlzoo.config.resolution import build_config
from rlzoo.config.schema import RunConfig, TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.interfaces import Sample
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, rl_step
from rlzoo.rl.objective import build_objective
from rlzoo.rl.teacher import Teacher, distill_metrics, teacher_cold_start_config
from rlzoo.runtime.cold_start import cold_start_dir, cold_start_fingerprint

TOKENIZER = build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def teacher_dir(request, tmp_path_factory):
    tiny = TinyModelConfig(
        architecture=request.param,
        hidden_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=64,
    )
    return save_model(
        build_tiny_model(tiny, TOKENIZER, seed=5), TOKENIZER, tmp_path_factory.mktemp(request.param) / "t"
    )


def _batch():
    prompts, answers = ["1+2=", "12+2=", "7+7=", "3+45="], ["3", "14", "14", "48"]
    return make_token_batch(
        [TOKENIZER(p)["input_ids"] for p in prompts], [TOKENIZER(a)["input_ids"] + [1] for a in answers], 0
    )


@pytest.mark.parametrize("budget,packing", [(10_000, True), (8, False), (8, True)])
def test_teacher_logprobs_are_a_direct_forward_of_the_teachers_model(teacher_dir, budget, packing):
    engine = TorchTrainingEngine()
    context = EngineContext(teacher_dir, pad_token_id=0, eos_token_id=1, seed=3)
    engine.start(context, TrainerConfig(max_tokens_per_micro_batch=budget, packing=packing))
    teacher = Teacher(Learner(engine))
    batch = _batch()
    logp = teacher.logprobs(batch)
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.double()
    direct = torch.log_softmax(logits, -1)
    for row in range(len(logp)):
        start, length = int(batch.response_start[row]), int(batch.response_mask[row].sum())
        targets = batch.input_ids[row, start : start + length]
        expected = direct[row, start - 1 : start - 1 + length].gather(-1, targets[:, None])[:, 0]
        assert torch.allclose(logp[row, :length].double(), expected, atol=1e-5)
        assert torch.all(logp[row, length:] == 0)
    assert engine.context.lora is None and engine.context.head == "lm"


class FixedTeacher(Teacher):
    """A teacher whose log-prob of every sampled token is ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(Learner(None))
        self.value, self.calls = value, 0

    def logprobs(self, batch):
        self.calls += 1
        return torch.where(batch.response_mask > 0, torch.full(batch.response_mask.shape, self.value), 0.0)


def _components(advantage: dict, teacher: Teacher | None) -> tuple[RunConfig, Components, list[Sample]]:
    registry = default_registry()
    config = RunConfig.model_validate(
        {
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 2},
            "algorithm": {"minibatches_per_rollout": 2},
        }
    )
    train_set = [Sample(name, "a") for name in ["mix0", "mix1"]]
    parts = Components(
        objective=build_objective({"clipper": {"name": "ppo"}}, registry),
        advantage=registry.create("advantage", advantage.pop("name"), advantage),
        verifier=IsA(),
        correction=registry.create("correction", "none"),
        rollout=ByPrompt(),  # every sampled token has rollout log-prob 0: the old log-probs are 0
        learner=NoModelLearner(None),
        tokenizer=CharTokenizer(),
        train_set=train_set,
        teacher=teacher,
    )  # type: ignore[arg-type]
    return config, parts, train_set


def test_the_loop_logs_the_reverse_kl_and_the_teachers_time_and_feeds_the_advantage():
    teacher = FixedTeacher(-0.5)
    config, parts, train_set = _components({"name": "reverse-kl", "task": None, "kl_coef": 2.0}, teacher)
    metrics = rl_step(0, train_set, parts, config)
    assert teacher.calls == 1  # once per step, before the updates
    assert metrics["distill/reverse_kl"] == pytest.approx(0.5)  # old 0 - teacher -0.5 on every policy token
    assert metrics["time/teacher"] >= 0.0
    # the advantage source read both log-probs: 2 * (-0.5 - 0) on every token
    assert metrics["advantage/abs_mean"] == pytest.approx(1.0)


def test_without_a_teacher_there_is_no_reverse_kl():
    config, parts, train_set = _components({"name": "group"}, None)
    metrics = rl_step(0, train_set, parts, config)
    assert "distill/reverse_kl" not in metrics


def test_reverse_kl_metric_is_the_token_mean_over_policy_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -float("inf"), 0.0]])
    teacher = torch.tensor([[-2.0, -1.0, 0.0], [-0.5, 0.0, float("-inf")]])
    assert distill_metrics(old, teacher, mask)["distill/reverse_kl"] == pytest.approx((1.0 - 1.0 + 0.0) / 3)


def test_the_tiny_teachers_cold_start_is_the_policys_with_its_own_sizes_and_folder(tmp_path):
    config = build_config(
        {
            "output_dir": str(tmp_path / "run"),
            "teacher": {"tiny": {"hidden_size": 128}},
            "algorithm": {"advantage": {"name": "reverse-kl"}},
        }
    )
    teacher = teacher_cold_start_config(config)
    assert teacher.model.tiny.hidden_size == 128 and teacher.model.path is None
    assert cold_start_dir(teacher) == tmp_path / "run" / "teacher_cold_start"
    assert teacher.task == config.task and teacher.seed == config.seed and teacher.prompt == config.prompt
    assert cold_start_fingerprint(teacher) != cold_start_fingerprint(config)  # never mistaken for the policy's
    elsewhere = config.model_copy(
        update={"teacher": config.teacher.model_copy(update={"output_dir": str(tmp_path / "t")})}
    )
    assert cold_start_dir(teacher_cold_start_config(elsewhere)) == tmp_path / "t"
    # the same settings give the same fingerprint: a resumed run reuses the folder
    assert cold_start_fingerprint(teacher_cold_start_config(config)) == cold_start_fingerprint(teacher)
