"""LoRA adapters on the policy (:mod:`rlzoo.engines.lora`): only the adapters train, the merged weights are the
wrapped model, the base policy is the model with its adapters disabled, checkpoints hold loadable adapters."""

from __future__ import annotations

import pytest
import torch
from test_critic import TOKENIZER, _batch, policy_dir  # noqa: F401  (the tiny dense and MoE policies)

from rlzoo.config.schema import LoraConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.lora import export_merged, split_targets, target_names
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import load_model
from rlzoo.models.weights import load_checkpoint_weights

MOE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj"]
DENSE_TARGETS = ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]


def _targets(model_dir) -> list[str]:
    return MOE_TARGETS if "moe" in str(model_dir) else DENSE_TARGETS


def _engine(model_dir, targets=None, **trainer) -> TorchTrainingEngine:
    engine = TorchTrainingEngine()
    lora = LoraConfig(rank=4, alpha=8, target_modules=targets or _targets(model_dir))
    context = EngineContext(model_dir, pad_token_id=0, eos_token_id=1, seed=3, lora=lora)
    engine.start(context, TrainerConfig(lr=0.05, **trainer))
    return engine


def _train(engine, steps=2):
    batch = _batch()
    for _ in range(steps):
        engine.train_step(batch, lambda logp: (-(logp * batch.response_mask).sum(), {}))
    return batch


def test_targets_split_into_projections_and_fused_expert_parameters(policy_dir):
    model, _ = load_model(policy_dir)
    modules, parameters, unknown = split_targets(model, _targets(policy_dir) + ["qkv", "lm_head", "gate"])
    assert unknown == ["qkv", "lm_head", "gate"]  # the output layer and the router are never targets
    if "moe" in str(policy_dir):
        assert parameters == ["experts.gate_up_proj", "experts.down_proj"] and "experts.down_proj" in target_names(
            model
        )
    else:
        assert parameters == [] and "down_proj" in modules


def test_only_the_adapters_train_and_the_base_stays_bit_exact(policy_dir):
    engine = _engine(policy_dir)
    base = {k: v.clone() for k, v in load_model(policy_dir)[0].state_dict().items()}
    trained = [name for name, p in engine.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained)
    assert any("experts" in name for name in trained) == ("moe" in str(policy_dir))
    batch = _batch()
    before = engine.logprobs(batch)
    _train(engine)
    assert not torch.allclose(engine.logprobs(batch), before)  # the adapters moved the policy
    # the base policy (the KL reference) is the initial model, bit for bit, although the adapters trained
    reference = engine.without_adapters().logprobs(batch)
    assert torch.equal(reference, before)
    model = engine.model.get_base_model()
    for name, tensor in model.state_dict().items():
        if "lora_" not in name:
            assert torch.equal(tensor, base[name.replace(".base_layer", "")]), name


def test_the_merged_weights_are_the_wrapped_policy(policy_dir):
    engine = _engine(policy_dir)
    batch = _batch()
    _train(engine)
    plain, _ = load_model(policy_dir)
    load_checkpoint_weights(plain, engine.named_weights())
    ids = batch.input_ids
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, engine.model(input_ids=ids).logits, atol=1e-5)


def test_a_checkpoint_holds_loadable_adapters_and_resumes_exactly(policy_dir, tmp_path):
    from peft import PeftModel

    engine = _engine(policy_dir)
    batch = _train(engine)
    engine.save(tmp_path)
    assert (tmp_path / "model" / "adapter_config.json").is_file()
    assert not (tmp_path / "model" / "model.safetensors").exists()  # the adapters, not a copy of the base
    loaded = PeftModel.from_pretrained(load_model(policy_dir)[0], str(tmp_path / "model"))
    with torch.no_grad():
        logits = loaded(input_ids=batch.input_ids).logits
        assert torch.allclose(logits, engine.model(input_ids=batch.input_ids).logits, atol=1e-6)
    resumed = _engine(policy_dir)
    resumed.load_state(tmp_path)
    _train(engine, 1)
    _train(resumed, 1)
    assert torch.equal(resumed.logprobs(batch), engine.logprobs(batch))  # optimizer state resumed too


def test_export_merges_the_adapters_into_a_plain_folder(policy_dir, tmp_path):
    engine = _engine(policy_dir)
    batch = _train(engine)
    engine.save(tmp_path / "ckpt")
    merged = export_merged(tmp_path / "ckpt" / "model", tmp_path / "merged")
    assert not (merged / "adapter_config.json").exists()
    plain, _ = load_model(merged)
    with torch.no_grad():
        assert torch.allclose(
            plain(input_ids=batch.input_ids).logits, engine.model(input_ids=batch.input_ids).logits, atol=1e-5
        )


def test_unknown_targets_are_refused_naming_the_field(policy_dir):
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules: \['qkv_proj'\].*use some of"):
        _engine(policy_dir, targets=["q_proj", "qkv_proj"])


def test_weight_copies_hold_the_adapters_only(policy_dir):
    engine = _engine(policy_dir)
    copy = engine.copy_weights()
    assert len(copy) == sum(1 for p in engine.model.parameters() if p.requires_grad)
    batch = _batch()
    before = engine.logprobs(batch)
    _train(engine)
    engine.exchange_weights(copy)
    assert torch.equal(engine.logprobs(batch), before)
