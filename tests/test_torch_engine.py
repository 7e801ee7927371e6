"""The plain-torch training engine: a non-finite loss skips the update and never writes NaN weights; the MoE aux loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.util.reductions import SkippedUpdates


def _engine(tmp_path):
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    engine = TorchTrainingEngine()
    engine.start(EngineContext(tmp_path / "m", pad_token_id=0, eos_token_id=1), TrainerConfig(lr=1e-2))
    batch = make_token_batch([tokenizer("1+2=")["input_ids"]] * 2, [tokenizer("3")["input_ids"] + [1]] * 2, 0)
    return engine, batch


def _weights(engine):
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def test_nonfinite_loss_skips_the_update(tmp_path):
    engine, batch = _engine(tmp_path)
    before = _weights(engine)
    metrics = engine.train_step(batch, lambda logp: (logp.sum() * float("nan"), {}))
    assert metrics["train/nonfinite_steps"] == 1.0 and type(metrics["train/nonfinite_steps"]) is SkippedUpdates
    after = _weights(engine)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_finite_loss_updates_and_reports_grad_norm(tmp_path):
    engine, batch = _engine(tmp_path)
    before = _weights(engine)
    metrics = engine.train_step(batch, lambda logp: (-logp.sum(), {}))
    assert metrics["train/nonfinite_steps"] == 0.0 and math.isfinite(metrics["train/grad_norm"])
    assert type(metrics["train/nonfinite_steps"]) is SkippedUpdates  # what the fault policy reads
    after = _weights(engine)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_logprobs_match_between_train_and_no_grad_paths(tmp_path):
    engine, batch = _engine(tmp_path)
    seen = {}

    def loss_fn(logp):
        seen["logp"] = logp.detach()
        return logp.sum() * 0.0, {}

    reference = engine.logprobs(batch)
    engine.train_step(batch, loss_fn)
    assert torch.allclose(seen["logp"], reference, atol=1e-6)
    assert (reference[batch.response_mask == 0] == 0).all() and (reference[batch.response_mask > 0] < 0).all()


def _aux_engine(tmp_path, architecture="qwen3_moe", **params):
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        architecture=architecture,
        hidden_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=64,
    )
    model_dir = tmp_path / architecture
    if not model_dir.exists():
        save_model(build_tiny_model(tiny, tokenizer), tokenizer, model_dir)
    engine = TorchTrainingEngine(TorchTrainingEngine.Params(**params))
    engine.start(EngineContext(model_dir, pad_token_id=0, eos_token_id=1), TrainerConfig(lr=1e-2))
    prompts = [tokenizer(p)["input_ids"] for p in ("1+2=", "33+4=", "5+66=")]
    responses = [tokenizer(r)["input_ids"] + [1] for r in ("3", "37", "71")]
    return engine, make_token_batch(prompts, responses, 0)


def test_aux_loss_is_reported_and_added_with_its_coefficient(tmp_path):
    from rlzoo.engines.aux_loss import AuxLossParams

    assert TorchTrainingEngine.Params().aux_loss_coef == AuxLossParams().aux_loss_coef == 0.0
    plain, batch = _aux_engine(tmp_path)
    weighted, _ = _aux_engine(tmp_path, aux_loss_coef=0.5)
    with torch.no_grad():
        expected = plain.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_router_logits=True
        ).aux_loss
    no_policy_loss = lambda logp: (logp.sum() * 0.0, {})  # noqa: E731 - only the aux term can move weights
    router = "model.layers.0.mlp.gate.weight"
    before = _weights(plain)[router]
    plain_metrics, weighted_metrics = (
        plain.train_step(batch, no_policy_loss),
        weighted.train_step(batch, no_policy_loss),
    )
    assert plain_metrics["train/aux_loss"] == pytest.approx(float(expected), abs=1e-6)
    assert weighted_metrics["train/aux_loss"] == pytest.approx(float(expected), abs=1e-6)
    assert torch.equal(_weights(plain)[router], before)  # coefficient 0: reported, not added
    assert not torch.equal(_weights(weighted)[router], before)  # the term reached the router


def test_dense_model_reports_no_aux_loss(tmp_path):
    engine, batch = _aux_engine(tmp_path, architecture="qwen3", aux_loss_coef=0.5)
    assert "train/aux_loss" not in engine.train_step(batch, lambda logp: (-logp.sum(), {}))


def test_a_nonfinite_gradient_of_a_finite_loss_is_a_declared_skipped_update(tmp_path):
    engine, batch = _engine(tmp_path)
    before = _weights(engine)
    metrics = engine.train_step(batch, lambda logp: (torch.sqrt(logp * 0.0).sum(), {}))  # loss 0, gradient NaN
    assert metrics["train/nonfinite_steps"] == 1.0 and type(metrics["train/nonfinite_steps"]) is SkippedUpdates
    assert all(torch.equal(before[k], _weights(engine)[k]) for k in before)
