"""The plain-torch training engine: a non-finite loss skips the update and never writes NaN weights."""

from __future__ import annotations

import math

import torch

from rlzoo.config import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model


def _engine(tmp_path):
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64)
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
    assert metrics["train/nonfinite_steps"] == 1.0
    after = _weights(engine)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_finite_loss_updates_and_reports_grad_norm(tmp_path):
    engine, batch = _engine(tmp_path)
    before = _weights(engine)
    metrics = engine.train_step(batch, lambda logp: (-logp.sum(), {}))
    assert metrics["train/nonfinite_steps"] == 0.0 and math.isfinite(metrics["train/grad_norm"])
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
