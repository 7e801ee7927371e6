"""The DeepSpeed training engine and the DeepSpeed-MoE conversion on a tiny Qwen3-MoE (2 layers, 4 experts, top-2).

Needs DeepSpeed (a core dependency; skipped with a reason when it is not importable). Nothing is compiled: the
engine uses torch AdamW as DeepSpeed's client optimizer and skips DeepSpeed's shm_comm op on CPU.

Measured on the 2-core CPU machine (fp32, the 8-row batch of ds_two_process.py, lr 1e-2, grad_clip 0.5 which binds
at every step, 3 steps); the tolerances below leave a 5-20x margin:

- DeepSpeed-MoE forward vs transformers: 4e-8 max |logit diff| (FORWARD_TOL 1e-5); router / expert gradients
  within 4e-12 / 1e-10; HF -> DeepSpeed-MoE -> HF weights bit-exact.
- 1 process vs the torch engine: ZeRO 0, 1, 2 bit-exact (losses, grad norms, weights); ZeRO 3 losses 4.8e-7,
  weights 8.0e-6; DeepSpeed-MoE at ZeRO 0 / 2 losses exact, weights 9.3e-7. (With a 4-row batch the weight gaps
  were up to 2.1e-5: AdamW divides by sqrt(v), which turns float-rounding differences of near-zero gradients into
  visible update differences, hence WEIGHT_TOL 2e-4.)
- 2 processes (torchrun, gloo) vs 1 process, global batch split across ranks: per-step loss within 3.1e-6, grad
  norms within 2.1e-6 relative, weights within 7.1e-6, for ZeRO 2, ZeRO 3, and DeepSpeed-MoE with expert
  parallelism ep_size=2 at ZeRO 0 and ZeRO 2.
- save / load_state: bit-exact resume (1 and 2 processes); the saved folder loads with AutoModelForCausalLM and
  gives the engine's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")

import ds_two_process as helper  # noqa: E402  (integration_tests/ is on sys.path: pytest's rootdir-relative import)
from runs_testlib import run_two_processes  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import EngineContext  # noqa: E402
from rlzoo.engines.deepspeed.env import shutdown_distributed
from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
from rlzoo.engines.tokens import response_logprobs  # noqa: E402
from rlzoo.engines.torch_trainer import TorchTrainingEngine  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model  # noqa: E402
from rlzoo.models.deepspeed_moe import (  # noqa: E402
    DeepSpeedMoEBlock,
    convert_to_deepspeed_moe,
    hf_layout,
    restore_hf_blocks,
)
from rlzoo.models.export import checkpoint_weights  # noqa: E402

FORWARD_TOL = 1e-5  # DeepSpeed-MoE vs transformers, fp32 logits
LOSS_TOL = 1e-5  # per-step loss, absolute (losses are ~5-8)
NORM_RTOL = 1e-5  # grad norm, relative
WEIGHT_TOL = 2e-4  # final weights, absolute, after 3 AdamW steps at lr 1e-2
GRAD_CLIP = 0.5  # below the measured grad norms (~7-10): clipping is active in every comparison
HELPER = Path(__file__).with_name("ds_two_process.py")

TINY = TinyModelConfig(
    architecture="qwen3_moe",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
)


@pytest.fixture(scope="module", autouse=True)
def _single_process_group():
    yield
    shutdown_distributed()  # later test modules get a process without a torch.distributed group


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    return save_model(build_tiny_model(TINY, tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("tiny_moe"))


@pytest.fixture(scope="module")
def batch(tokenizer):
    return helper.global_batch(tokenizer)


def _context(model_dir: Path, tokenizer) -> EngineContext:
    return EngineContext(model_dir, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)


def _deepspeed(model_dir, tokenizer, grad_clip=GRAD_CLIP, **params) -> DeepSpeedTrainingEngine:
    engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(**params))
    engine.start(_context(model_dir, tokenizer), helper.trainer_config(grad_clip))
    return engine


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in engine.named_weights()}


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _train(engine, batch, steps=helper.STEPS):
    metrics = [engine.train_step(batch, helper.loss_fn) for _ in range(steps)]
    return [m["loss"] for m in metrics], [m["train/grad_norm"] for m in metrics]


# -- (a) DeepSpeed-MoE layers vs transformers ------------------------------------------------------------------


def test_deepspeed_moe_forward_and_gradients_match_transformers(tokenizer, batch):
    reference = build_tiny_model(TINY, tokenizer, seed=0)
    converted = build_tiny_model(TINY, tokenizer, seed=0)
    assert convert_to_deepspeed_moe(converted) == TINY.num_hidden_layers
    assert all(isinstance(layer.mlp, DeepSpeedMoEBlock) for layer in converted.model.layers)
    # the HF router stays at mlp.gate (the module routing replay hooks), under its HF parameter name
    assert converted.model.layers[0].mlp.gate is not None
    assert "model.layers.0.mlp.gate.weight" in dict(converted.named_parameters())

    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    expected = reference(**inputs).logits
    got = converted(**inputs).logits
    assert (got - expected).abs().max().item() <= FORWARD_TOL

    expected.square().mean().backward()
    got.square().mean().backward()
    ref_params = dict(reference.named_parameters())
    for i, layer in enumerate(converted.model.layers):
        block = layer.mlp
        router_gap = (block.gate.weight.grad - ref_params[f"model.layers.{i}.mlp.gate.weight"].grad).abs().max()
        assert router_gap <= 1e-8
        gate_up = torch.stack([e.gate_up_proj.weight.grad for e in block.local_experts])
        down = torch.stack([e.down_proj.weight.grad for e in block.local_experts])
        assert (gate_up - ref_params[f"model.layers.{i}.mlp.experts.gate_up_proj"].grad).abs().max() <= 1e-8
        assert (down - ref_params[f"model.layers.{i}.mlp.experts.down_proj"].grad).abs().max() <= 1e-8
        assert block.l_aux is not None and torch.isfinite(block.l_aux)


def test_weight_mapping_round_trips_exactly(tokenizer):
    model = build_tiny_model(TINY, tokenizer, seed=1)
    original = {name: tensor.clone() for name, tensor in checkpoint_weights(model)}
    in_memory = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    convert_to_deepspeed_moe(model)
    with hf_layout(model):  # DeepSpeed-MoE -> HF checkpoint names and values
        exported = {name: tensor.clone() for name, tensor in checkpoint_weights(model)}
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[k], original[k]) for k in original)

    assert restore_hf_blocks(model) == TINY.num_hidden_layers  # and all the way back to the transformers model
    restored = model.state_dict()
    assert sorted(restored) == sorted(in_memory)
    assert all(torch.equal(restored[k], in_memory[k]) for k in in_memory)


def test_a_router_hook_drives_both_paths(tokenizer, batch):
    """A forward hook on ``mlp.gate`` that replaces the top-k is obeyed by transformers and DeepSpeed-MoE alike."""
    hf = build_tiny_model(TINY, tokenizer, seed=2)
    ds = build_tiny_model(TINY, tokenizer, seed=2)
    convert_to_deepspeed_moe(ds)

    def forced_routing(module, inputs, output):
        logits, _, indices = output
        forced = (torch.arange(indices.shape[0]).unsqueeze(1) + torch.arange(indices.shape[1])) % module.num_experts
        probs = torch.softmax(logits.float(), dim=-1).gather(1, forced)
        return logits, (probs / probs.sum(dim=-1, keepdim=True)).to(logits.dtype), forced

    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    with torch.no_grad():
        free = hf(**inputs).logits
        handles = [layer.mlp.gate.register_forward_hook(forced_routing) for m in (hf, ds) for layer in m.model.layers]
        forced_hf, forced_ds = hf(**inputs).logits, ds(**inputs).logits
        for handle in handles:
            handle.remove()
    assert (forced_hf - free).abs().max() > 1e-4  # the hook changed the routing ...
    assert (forced_ds - forced_hf).abs().max() <= FORWARD_TOL  # ... identically on both paths


# -- (b) one process: the DeepSpeed engine vs the torch engine ---------------------------------------------------

CONFIGS = {
    "zero0": dict(zero_stage=0),
    "zero1": dict(zero_stage=1),
    "zero2": dict(zero_stage=2),
    "zero3": dict(zero_stage=3),
    "zero0-dsmoe": dict(zero_stage=0, moe="deepspeed"),
    "zero2-dsmoe": dict(zero_stage=2, moe="deepspeed"),
}


@pytest.fixture(scope="module")
def torch_reference(model_dir, tokenizer, batch):
    engine = TorchTrainingEngine()
    engine.start(_context(model_dir, tokenizer), helper.trainer_config(GRAD_CLIP))
    losses, norms = _train(engine, batch)
    return losses, norms, _weights(engine)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_the_torch_engine_and_skips_nonfinite_steps(name, model_dir, tokenizer, batch, torch_reference):
    ref_losses, ref_norms, ref_weights = torch_reference
    engine = _deepspeed(model_dir, tokenizer, **CONFIGS[name])
    losses, norms = _train(engine, batch)
    assert losses == pytest.approx(ref_losses, abs=LOSS_TOL)
    assert norms == pytest.approx(ref_norms, rel=NORM_RTOL)
    assert _max_gap(_weights(engine), ref_weights) <= WEIGHT_TOL

    before = _weights(engine)
    nan_loss = engine.train_step(batch, lambda logp: (logp.sum() * float("nan"), {}))
    nan_grad = engine.train_step(batch, lambda logp: (torch.sqrt(logp.sum() * 0.0), {}))  # finite loss, NaN grads
    assert nan_loss["train/nonfinite_steps"] == 1.0 and nan_grad["train/nonfinite_steps"] == 1.0
    after = _weights(engine)
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the skipped steps left no NaN in the optimizer either: a normal step afterwards is finite
    assert engine.train_step(batch, helper.loss_fn)["train/nonfinite_steps"] == 0.0
    assert all(torch.isfinite(t).all() for t in _weights(engine).values())


@pytest.mark.parametrize("moe", ["none", "deepspeed"])
def test_router_aux_loss_is_transformers_load_balancing_loss(moe, model_dir, tokenizer, batch):
    hf, _ = load_model(model_dir)
    with torch.no_grad():
        expected = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_router_logits=True)
    plain = _deepspeed(model_dir, tokenizer, moe=moe)
    weighted = _deepspeed(model_dir, tokenizer, moe=moe, aux_loss_coef=0.5)
    plain_metrics = plain.train_step(batch, helper.loss_fn)
    weighted_metrics = weighted.train_step(batch, helper.loss_fn)
    assert plain_metrics["train/aux_loss"] == pytest.approx(float(expected.aux_loss), abs=1e-6)
    assert weighted_metrics["train/aux_loss"] == pytest.approx(float(expected.aux_loss), abs=1e-6)
    router = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(_weights(plain)[router], _weights(weighted)[router])  # the term reached the router


@pytest.mark.parametrize("moe", ["none", "deepspeed"])
def test_torch_and_deepspeed_engines_add_the_same_aux_loss(moe, model_dir, tokenizer, batch):
    """Same weights and batch: the same train/aux_loss and, with only the aux term in the loss, the same update."""
    reference = TorchTrainingEngine(TorchTrainingEngine.Params(aux_loss_coef=0.5))
    reference.start(_context(model_dir, tokenizer), helper.trainer_config(GRAD_CLIP))
    engine = _deepspeed(model_dir, tokenizer, moe=moe, aux_loss_coef=0.5)
    before = _weights(reference)
    aux_only = lambda logp: (logp.sum() * 0.0, {})  # noqa: E731 - the gradient is the aux term's alone
    expected, got = reference.train_step(batch, aux_only), engine.train_step(batch, aux_only)
    assert float(got["train/aux_loss"]) == pytest.approx(float(expected["train/aux_loss"]), abs=1e-6)
    assert got["train/grad_norm"] == pytest.approx(expected["train/grad_norm"], rel=NORM_RTOL)
    assert expected["train/grad_norm"] > 0 and _max_gap(_weights(reference), before) > 0
    assert _max_gap(_weights(engine), _weights(reference)) <= WEIGHT_TOL


def test_zero3_loads_the_model_partitioned(model_dir, tokenizer, monkeypatch):
    """At ZeRO-3 the checkpoint is loaded under ``zero.Init`` (no rank materialises the whole fp32 model), and only
    that load: a model loaded afterwards in the same process (a rollout engine's) is whole."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    import rlzoo.models

    seen = []
    original = rlzoo.models.load_model

    def recording_load(*args, **kwargs):
        seen.append(is_deepspeed_zero3_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(rlzoo.models, "load_model", recording_load)
    _deepspeed(model_dir, tokenizer, zero_stage=2)
    engine = _deepspeed(model_dir, tokenizer, zero_stage=3)
    assert seen == [False, True]
    assert not is_deepspeed_zero3_enabled()
    assert all(hasattr(q, "ds_id") and q.numel() == 0 for q in engine.model.parameters())  # partitioned in place
    whole, _ = original(model_dir)
    assert all(q.numel() > 0 and not hasattr(q, "ds_id") for q in whole.parameters())


def test_invalid_combinations_are_refused(model_dir, tokenizer):
    # what DeepSpeed refuses whatever the world is rejected by the engine's Params, i.e. at config validation
    with pytest.raises(ValidationError, match="ZeRO-3"):
        _deepspeed(model_dir, tokenizer, zero_stage=3, moe="deepspeed")
    with pytest.raises(ValidationError, match="needs moe: deepspeed"):
        _deepspeed(model_dir, tokenizer, ep_size=2)
    with pytest.raises(ValueError, match="world size"):
        _deepspeed(model_dir, tokenizer, moe="deepspeed", ep_size=2)  # one process cannot hold 2 expert ranks


# -- (d) save / load_state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zero0", "zero2-dsmoe", "zero3"])
def test_save_and_resume_exactly(name, model_dir, tokenizer, batch, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = _deepspeed(model_dir, tokenizer, **CONFIGS[name])
    _train(engine, batch, steps=1)
    engine.save(tmp_path)
    assert (tmp_path / "model" / "model.safetensors").is_file() and (tmp_path / "deepspeed.json").is_file()
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))  # no pickle anywhere

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    saved_names = set(load_file(str(tmp_path / "model" / "model.safetensors")))
    assert saved_names == {n for n, _ in engine.named_weights()}  # the HF checkpoint layout (per-expert names)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    with torch.no_grad():
        assert (saved(**inputs).logits - engine.engine(**inputs).logits).abs().max() <= FORWARD_TOL
    assert (response_logprobs(saved, batch) - engine.logprobs(batch)).abs().max() <= FORWARD_TOL

    continued = _train(engine, batch, steps=2)
    resumed_engine = _deepspeed(model_dir, tokenizer, **CONFIGS[name])
    resumed_engine.load_state(tmp_path)
    resumed = _train(resumed_engine, batch, steps=2)
    assert resumed == continued  # bit-exact: weights, fp32 master copies and AdamW moments were all restored
    assert _max_gap(_weights(resumed_engine), _weights(engine)) == 0.0


def test_a_checkpoint_of_another_layout_is_refused(model_dir, tokenizer, tmp_path):
    _deepspeed(model_dir, tokenizer, zero_stage=2).save(tmp_path)
    other = _deepspeed(model_dir, tokenizer, zero_stage=1)
    with pytest.raises(ValueError, match="same ZeRO stage"):
        other.load_state(tmp_path)


# -- (c) two processes vs one ------------------------------------------------------------------------------------

TWO_PROCESS_RUNS = [
    {"name": "zero2", "params": dict(zero_stage=2), "grad_clip": GRAD_CLIP},
    {"name": "zero3", "params": dict(zero_stage=3), "grad_clip": GRAD_CLIP},
    {"name": "ep2-zero0", "params": dict(zero_stage=0, moe="deepspeed", ep_size=2), "grad_clip": GRAD_CLIP},
    {"name": "ep2-zero2", "params": dict(zero_stage=2, moe="deepspeed", ep_size=2), "grad_clip": GRAD_CLIP},
]


@pytest.fixture(scope="module")
def two_process_results(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two_process")
    run_two_processes(HELPER, str(model_dir), str(out), json.dumps(TWO_PROCESS_RUNS), timeout=400)
    return out


@pytest.mark.parametrize("run", TWO_PROCESS_RUNS, ids=[r["name"] for r in TWO_PROCESS_RUNS])
def test_two_processes_match_one(run, two_process_results, model_dir, tokenizer, batch):
    record = json.loads((two_process_results / f"{run['name']}.json").read_text())
    two_weights = load_file(str(two_process_results / f"{run['name']}.safetensors"))

    one = _deepspeed(model_dir, tokenizer, grad_clip=run["grad_clip"], **{**run["params"], "ep_size": 1})
    losses, norms = _train(one, batch)
    assert record["losses"] == pytest.approx(losses, abs=LOSS_TOL)
    assert record["grad_norms"] == pytest.approx(norms, rel=NORM_RTOL)
    assert _max_gap(two_weights, _weights(one)) <= WEIGHT_TOL
    # the multi-process checkpoint resumed exactly on both ranks
    resume = record["resume"]
    assert resume["resumed_loss"] == resume["continued_loss"] and resume["max_weight_gap"] == 0.0


@pytest.mark.parametrize("moe", ["none", "deepspeed"])
def test_entropy_matches_the_torch_engine_and_trains(model_dir, tokenizer, batch, moe):
    """DeepSpeed (DeepSpeed-MoE included) returns the full distribution's per-token entropy like the torch engine,
    without gradient and, in the update pass, with it."""
    reference = TorchTrainingEngine()
    reference.start(_context(model_dir, tokenizer), helper.trainer_config(GRAD_CLIP))
    want_logp, want_entropy = reference.logprobs_and_entropy(batch)
    engine = _deepspeed(model_dir, tokenizer, moe=moe)
    logp, entropy = engine.logprobs_and_entropy(batch)
    assert (logp - want_logp).abs().max() <= FORWARD_TOL
    assert (entropy - want_entropy).abs().max() <= FORWARD_TOL
    assert (entropy[batch.response_mask > 0] > 0).all()
    seen = {}

    def loss_fn(logp, entropy):
        seen["entropy"] = entropy.detach()
        return -(entropy * batch.response_mask).sum(), {}

    assert engine.train_step(batch, loss_fn, with_entropy=True)["train/nonfinite_steps"] == 0.0
    assert (seen["entropy"] - entropy).abs().max() <= FORWARD_TOL


def test_an_engine_starts_after_the_process_group_was_destroyed(model_dir, tokenizer, batch):
    """vLLM's close destroys the default process group of the process it ran in; ``rlzoo mismatch --causes`` then
    starts the next measurement's engine in the same process: DeepSpeed's cached groups of the first engine are
    dropped, and the new engine (DeepSpeed-MoE, whose expert groups are cached too) trains."""
    import torch.distributed as dist

    _deepspeed(model_dir, tokenizer, zero_stage=2, moe="deepspeed")
    dist.destroy_process_group()
    engine = _deepspeed(model_dir, tokenizer, zero_stage=2, moe="deepspeed")
    assert engine.train_step(batch, helper.loss_fn)["train/nonfinite_steps"] == 0.0
