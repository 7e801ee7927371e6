"""Micro-batches over two processes (torchrun, gloo): the gradient of a minibatch split over both ranks, each rank in
several micro-batches (and a different number of them), equals one forward per rank: to 1e-6 in float64 for every
aggregation and the batch-level clippers, and to float32 precision through DeepSpeed's own accumulation at ZeRO 0
and 2. The single-process cases are in tests/test_micro_batches.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs_testlib import run_two_processes

pytest.importorskip("deepspeed")

from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402

HELPER = Path(__file__).with_name("ds_micro_batches.py")
OBJECTIVES = {
    "token-mean": {"aggregation": {"name": "token-mean"}},
    "seq-mean-token-mean": {"aggregation": {"name": "seq-mean-token-mean"}},
    "seq-mean-token-sum": {"aggregation": {"name": "seq-mean-token-sum"}},
    "seq-mean-token-sum-norm": {"aggregation": {"name": "seq-mean-token-sum-norm"}},
    "sequence-ratio": {"ratio": {"name": "sequence"}, "clipper": {"name": "ppo", "eps_low": 0.01, "eps_high": 0.01}},
    "kl-cov": {"clipper": {"name": "kl-cov", "select_fraction": 0.2}},
    "gmpo": {"clipper": {"name": "gmpo"}},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("micro_two")
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(architecture="qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, root / "model")
    run_two_processes(HELPER, str(root / "model"), str(root), json.dumps(OBJECTIVES), timeout=600)
    return root


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_two_processes_in_micro_batches_match_one_forward_per_rank(results, name):
    record = json.loads((results / f"{name}-torch-float64.json").read_text())
    assert record["micro_batches"][0] == 1 and record["micro_batches"][1] >= 3
    assert record["same_keys"]
    assert abs(record["loss_one"] - record["loss_many"]) < 1e-6
    assert record["max_grad"] > 1e-4 and record["max_grad_gap"] < 1e-6


@pytest.mark.parametrize("engine", ["deepspeed-zero0", "deepspeed-zero2"])
@pytest.mark.parametrize("name", ["token-mean", "kl-cov"])
def test_deepspeed_accumulates_micro_batches_as_one_forward(results, name, engine):
    """DeepSpeed's own accumulation (the boundary at the last micro-batch, reduction then), in float32."""
    record = json.loads((results / f"{name}-{engine}.json").read_text())
    assert record["micro_batches"][0] == 1 and record["micro_batches"][1] >= 3
    assert abs(record["loss_one"] - record["loss_many"]) < 1e-5
    assert record["max_grad_gap"] <= 1e-5 * record["max_grad"] + 1e-7
