"""The router load-balancing loss (rlzoo.moe.balance) against transformers' load_balancing_loss_func."""

from __future__ import annotations

import pytest
import torch
import transformers

from rlzoo.moe import RouterLogits, find_routers, load_balancing_loss

VOCAB = 40
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=64,
    max_position_embeddings=128,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=1,
)
FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2)),
}


def tiny(family: str) -> torch.nn.Module:
    config_cls, model_cls, moe = FAMILIES[family]
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**COMMON, **moe)).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding, as TokenBatch
    mask[2, 4:] = 0
    return ids, mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_collected_loss_is_transformers_aux_loss(family):
    model = tiny(family)
    ids, mask = padded_batch()
    collector = RouterLogits(find_routers(model))
    with torch.no_grad(), collector.collect() as logits:
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    assert len(logits) == 2 and all(got.shape == (30, 8) for got in logits)
    expected = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(out.router_logits, 8, 2, mask)
    assert float(collector.loss(mask)) == pytest.approx(float(expected), abs=1e-6)
    assert float(collector.loss(mask)) == pytest.approx(float(out.aux_loss), abs=1e-6)
    # padding is excluded: counting it changes the value
    assert abs(float(collector.loss(None)) - float(collector.loss(mask))) > 1e-4


def test_formula_on_a_hand_computed_case():
    # 2 tokens, 2 experts, top-1: token 0 -> expert 0 (p = [0.73, 0.27]), token 1 -> expert 1 (p = [0.27, 0.73])
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.softmax(logits, dim=-1)
    f = torch.tensor([0.5, 0.5])
    assert float(load_balancing_loss([logits], 2, 1, None)) == pytest.approx(float(2 * (f * p.mean(0)).sum()))
    # all mass on expert 0 is penalised more than a balanced routing
    skewed = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    assert float(load_balancing_loss([skewed], 2, 1, None)) > float(load_balancing_loss([logits], 2, 1, None))


def test_logits_are_collected_only_inside_the_block_and_carry_gradient():
    model = tiny("qwen3_moe").train()
    ids, mask = padded_batch()
    collector = RouterLogits(find_routers(model))
    model(input_ids=ids)  # outside: nothing collected, no hook left behind
    assert collector.loss(mask) is None
    with collector.collect():
        model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids)  # after exit: hooks are gone
    assert len(collector.logits) == 2
    collector.loss(mask).backward()
    assert all(r.module.weight.grad.abs().sum() > 0 for r in find_routers(model))
    collector.clear()
    assert collector.loss(mask) is None


def test_a_dense_model_has_no_aux_loss():
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON)).eval()
    collector = RouterLogits(find_routers(model))
    with torch.no_grad(), collector.collect():
        model(input_ids=padded_batch()[0])
    assert collector.loss(None) is None
