"""The deepspeed engine's weight push at ZeRO-3 gathers one decoder layer at a time, and gives exactly the weights
of the whole-model gather (names, order, values with torch.equal), in one process and in two (torchrun, gloo).

The memory bound is measured, not assumed: while the iterator is consumed, the elements of partitioned parameters
that are gathered on the rank (ZeRO-3 status AVAILABLE) never exceed the largest unit (one decoder layer here),
where the whole-model gather holds every element. The tiny model has 12 layers so that bound is far below the whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")

import ds_layerwise as helper  # noqa: E402  (integration_tests/ is on sys.path)
import ds_two_process  # noqa: E402
from runs_testlib import run_two_processes  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlzoo.config.schema import TinyModelConfig  # noqa: E402
from rlzoo.engines import EngineContext  # noqa: E402
from rlzoo.engines.deepspeed.env import shutdown_distributed  # noqa: E402
from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402

TINY = TinyModelConfig(
    architecture="qwen3_moe",
    hidden_size=32,
    num_hidden_layers=12,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
)
HELPER = Path(__file__).with_name("ds_layerwise.py")


@pytest.fixture(scope="module", autouse=True)
def _single_process_group():
    yield
    shutdown_distributed()


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    return save_model(build_tiny_model(TINY, tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("tiny_moe_12"))


def _check(layerwise, whole, record) -> None:
    assert record["layerwise_names"] == record["whole_names"]  # same names, same order
    assert len(layerwise) == len(whole)
    for (name, a), (_, b) in zip(layerwise, whole, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    # nothing gathered between pushes; the whole gather holds every element, the layer-wise push one unit at most
    assert record["before"] == record["after"] == 0
    assert record["whole_gathered"] == record["total"]
    assert 0 < record["layerwise_peak"] <= record["largest_unit"] < record["total"] / 5


@pytest.mark.slow  # the two-process test below makes the same checks on weights split over ranks
def test_one_process_layer_by_layer_equals_the_whole_gather(model_dir, tokenizer):
    engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(zero_stage=3))
    context = EngineContext(model_dir, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    with helper.every_parameter_partitioned():
        engine.start(context, ds_two_process.trainer_config(0.5))
    engine.train_step(ds_two_process.global_batch(tokenizer), ds_two_process.loss_fn)
    layerwise, whole, record = helper.measure(engine)
    _check(layerwise, whole, record)


def test_two_processes_layer_by_layer_equals_the_whole_gather(model_dir, tmp_path):
    run_two_processes(HELPER, str(model_dir), str(tmp_path), timeout=400)
    record = json.loads((tmp_path / "record.json").read_text())
    layerwise = load_file(str(tmp_path / "layerwise.safetensors"))
    whole = load_file(str(tmp_path / "whole.safetensors"))
    _check(
        [(n, layerwise[n]) for n in record["layerwise_names"]], [(n, whole[n]) for n in record["whole_names"]], record
    )
