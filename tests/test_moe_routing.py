"""Routing Replay mechanics (rlzoo.moe): record / replay on transformers MoE routers, flip rates, R3 capture."""

from __future__ import annotations

import pytest
import torch
import transformers

from rlzoo.engines.tokens import make_token_batch, response_logprobs
from rlzoo.moe import (
    Routing,
    RoutingError,
    find_routers,
    flip_rate,
    flip_rate_per_layer,
    record_routing,
    replay_routing,
    routing_for_batch,
)

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
# family -> (config class, model class, MoE keys, gate function replay must detect)
FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
        "softmax-topk-renorm",
    ),
    "qwen3_moe_unnormalised": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False),
        "softmax-topk",
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            norm_topk_prob=True,
        ),
        "softmax-topk-renorm",
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=8, num_experts_per_tok=2),
        "softmax-topk-renorm",
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2), "softmax-topk"),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_local_experts=8, num_experts_per_tok=2, layer_types=["full_attention"] * 2),
        "topk-softmax",
    ),
}


def tiny(family: str = "qwen3_moe", seed: int = 0, **overrides) -> torch.nn.Module:
    config_cls, model_cls, moe, _ = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**COMMON, **moe, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def tokens(rows: int = 4, width: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (rows, width), generator=torch.Generator().manual_seed(seed))


def next_token_loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def all_hooks(model: torch.nn.Module) -> int:
    names = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
    )
    return sum(len(getattr(m, n, {})) for m in model.modules() for n in names)


def adamw_step(model: torch.nn.Module, x: torch.Tensor, lr: float = 1e-2) -> None:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    next_token_loss(model, x).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


# -- discovery ---------------------------------------------------------------------------------------------------


def test_find_routers_keys_by_layer():
    model = tiny()
    routers = find_routers(model)
    assert [(r.layer, r.name, r.num_experts, r.top_k) for r in routers] == [
        (0, "model.layers.0.mlp.gate", 8, 2),
        (1, "model.layers.1.mlp.gate", 8, 2),
    ]
    # layers without MoE (mlp_only_layers) are skipped; the layer index is the decoder layer's, not a counter
    sparse = tiny(num_hidden_layers=3, mlp_only_layers=[1])
    assert [r.layer for r in find_routers(sparse)] == [0, 2]
    with record_routing(sparse) as routing, torch.no_grad():
        sparse(input_ids=tokens(2, 5))
    assert routing.layers == (0, 2) and routing.shape == (2, 5, 2, 2)


def test_dense_model_has_no_routers():
    config = transformers.Qwen3Config(**{k: v for k, v in COMMON.items()})
    dense = transformers.Qwen3ForCausalLM(config)
    assert find_routers(dense) == []
    with pytest.raises(RoutingError, match="no MoE router"):
        with record_routing(dense):
            pass


# -- replay at unchanged weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_replay_reproduces_the_recorded_forward_exactly(family):
    model = tiny(family)
    x = tokens()
    with torch.no_grad(), record_routing(model) as routing:
        recorded = model(input_ids=x).logits
    assert routing.shape == (4, 16, 2, 2) and routing.indices.dtype == torch.uint8
    with torch.no_grad(), replay_routing(model, routing) as replay:
        replayed = model(input_ids=x).logits
    assert torch.equal(replayed, recorded), (replayed - recorded).abs().max()
    assert set(replay.gate_functions.values()) == {FAMILIES[family][3]}
    # log-probs too (what the objective consumes)
    assert torch.equal(torch.log_softmax(replayed, -1), torch.log_softmax(recorded, -1))


def test_replaying_a_different_routing_changes_the_output():
    """The replayed indices really reach the experts (guards against a replay that silently routes afresh)."""
    model = tiny()
    x = tokens()
    with torch.no_grad(), record_routing(model) as routing:
        recorded = model(input_ids=x).logits
    shifted = Routing((routing.indices.long() + 1) % 8, routing.layers, 8)
    seen = []
    handle = model.model.layers[0].mlp.experts.register_forward_pre_hook(lambda _m, args: seen.append(args[1].clone()))
    try:
        with torch.no_grad(), replay_routing(model, shifted):
            replayed = model(input_ids=x).logits
    finally:
        handle.remove()
    assert torch.equal(seen[0].cpu(), shifted.indices[:, :, 0].reshape(-1, 2).long())
    assert not torch.allclose(replayed, recorded)


def test_unsupported_router_is_an_error():
    """A sigmoid / bias-corrected router (GLM-4-MoE, DeepSeek-V3 style) cannot be replayed: say so, by name."""
    config = transformers.Glm4MoeConfig(
        **COMMON,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
    )
    model = transformers.Glm4MoeForCausalLM(config).eval()
    with torch.no_grad(), record_routing(model) as routing:
        model(input_ids=tokens(1, 4))
    with pytest.raises(RoutingError, match=r"model\.layers\.0\.mlp\.gate .*none of"):
        with torch.no_grad(), replay_routing(model, routing):
            model(input_ids=tokens(1, 4))


# -- after an optimizer step -------------------------------------------------------------------------------------


def test_replay_removes_expert_flips_after_an_adamw_step():
    model = tiny()
    x = tokens(4, 16)
    with torch.no_grad(), record_routing(model) as old:
        model(input_ids=x)
    adamw_step(model, x, lr=1e-2)

    with torch.no_grad(), record_routing(model) as fresh:
        model(input_ids=x)
    without_replay = flip_rate(old, fresh)
    assert without_replay > 0.0

    model.train()
    model.zero_grad(set_to_none=True)
    with replay_routing(model, old) as replay, record_routing(model) as used:
        next_token_loss(model, x).backward()
    assert flip_rate(old, used) == 0.0
    assert torch.equal(used.indices, old.indices)
    # what replay removed: the current router's own choice in layer 0 (same input as the fresh pass) flips as often
    assert flip_rate(old, replay.fresh) > 0.0
    assert torch.equal(replay.fresh.indices[:, :, 0], fresh.indices[:, :, 0])
    # the router still learns under replay
    for router in find_routers(model):
        assert router.module.weight.grad is not None and router.module.weight.grad.abs().sum() > 0


def test_replayed_gate_weights_come_from_the_current_router():
    """Under replay the experts get softmax(current logits) at the *recorded* experts, renormalised as the model does."""
    model = tiny()
    x = tokens()
    with torch.no_grad(), record_routing(model) as old:
        model(input_ids=x)
    adamw_step(model, x)
    gate = model.model.layers[0].mlp.gate
    seen = {}
    handles = [
        gate.register_forward_hook(lambda _m, args, _out: seen.update(hidden=args[0])),
        model.model.layers[0].mlp.experts.register_forward_pre_hook(
            lambda _m, args: seen.update(index=args[1], weights=args[2])
        ),
    ]
    # entered before replay: the recorder still sees the replayed experts (replay's hook runs first)
    with torch.no_grad(), record_routing(model) as used, replay_routing(model, old):
        model(input_ids=x)
    for handle in handles:
        handle.remove()
    recorded = old.indices[:, :, 0].reshape(-1, 2).long()
    probs = torch.softmax(torch.nn.functional.linear(seen["hidden"], gate.weight), dim=-1, dtype=torch.float32)
    expected = probs.gather(1, recorded)
    expected = expected / expected.sum(-1, keepdim=True)
    assert torch.equal(seen["index"], recorded)
    assert torch.equal(seen["weights"], expected)
    assert flip_rate(old, used) == 0.0


def test_flip_rate_grows_with_the_learning_rate():
    rates = []
    for lr in (1e-5, 1e-2):
        model = tiny()
        x = tokens(4, 16)
        with torch.no_grad(), record_routing(model) as old:
            model(input_ids=x)
        adamw_step(model, x, lr=lr)
        with torch.no_grad(), record_routing(model) as fresh:
            model(input_ids=x)
        rates.append(flip_rate(old, fresh))
    assert rates[0] < rates[1]


def test_replay_is_correct_under_gradient_checkpointing():
    """Recomputation in backward calls the routers again: records keyed by layer replay the same experts."""
    x = tokens(2, 12)
    grads = []
    for checkpointing in (False, True):
        model = tiny()
        with torch.no_grad(), record_routing(model) as old:
            model(input_ids=x)
        adamw_step(model, x)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        calls = []
        handle = model.model.layers[1].mlp.gate.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        with replay_routing(model, old), record_routing(model) as used:
            next_token_loss(model, x).backward()
        handle.remove()
        assert len(calls) == (2 if checkpointing else 1)  # the recomputation really happened
        assert flip_rate(old, used) == 0.0 and used.batch_size == 2  # recomputation adds no rows
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5), name


def test_micro_batches_consume_rows_in_order():
    model = tiny()
    x = tokens(4, 10)
    with torch.no_grad(), record_routing(model) as old:
        model(input_ids=x)
    adamw_step(model, x)
    with torch.no_grad(), replay_routing(model, old):
        full = model(input_ids=x).logits
    with torch.no_grad(), replay_routing(model, old) as replay, record_routing(model) as used:
        halves = torch.cat([model(input_ids=x[:2]).logits, model(input_ids=x[2:]).logits])
        assert replay.calls == 2
    assert torch.allclose(full, halves, atol=1e-5)
    assert flip_rate(old, used) == 0.0 and used.batch_size == 4
    # a minibatch's slice, aligned with TokenBatch row selection
    rows = torch.tensor([3, 1])
    with torch.no_grad(), replay_routing(model, old.select(rows)), record_routing(model) as used_rows:
        model(input_ids=x[rows])
    assert torch.equal(used_rows.indices, old[rows].indices)
    with pytest.raises(RoutingError, match="rows"):
        with torch.no_grad(), replay_routing(model, old.select(rows)):
            model(input_ids=x)


# -- clean detach ------------------------------------------------------------------------------------------------


def test_everything_is_removed_on_exit():
    model = tiny()
    x = tokens()
    hooks_before = all_hooks(model)
    router_cls = type(model.model.layers[0].mlp.gate)
    forward_before = router_cls.forward
    with torch.no_grad():
        before = model(input_ids=x).logits
    with torch.no_grad(), record_routing(model) as routing:
        model(input_ids=x)
        assert all_hooks(model) > hooks_before
    with torch.no_grad(), replay_routing(model, routing), record_routing(model):
        assert all_hooks(model) > hooks_before
        model(input_ids=x)
    with pytest.raises(ValueError, match="boom"), replay_routing(model, routing):
        raise ValueError("boom")
    assert all_hooks(model) == hooks_before == 0
    assert router_cls.forward is forward_before
    assert all("forward" not in vars(m) for m in model.modules())  # no per-instance wrappers left
    with torch.no_grad():
        after = model(input_ids=x).logits
    assert torch.equal(before, after)


# -- the Routing record ------------------------------------------------------------------------------------------


def test_routing_is_compact():
    model = tiny()
    with torch.no_grad(), record_routing(model) as routing:
        model(input_ids=tokens(4, 16))
    assert routing.indices.dtype == torch.uint8
    assert routing.nbytes == 4 * 16 * 2 * 2  # one byte per (token, layer, k)
    big = tiny(num_experts=300, hidden_size=32, num_attention_heads=1, moe_intermediate_size=4)
    raw = []
    handle = big.model.layers[0].mlp.gate.register_forward_hook(lambda _m, _a, out: raw.append(out[2]))
    with torch.no_grad(), record_routing(big) as routing_big:
        big(input_ids=tokens(2, 8))
    handle.remove()
    assert routing_big.indices.dtype == torch.int16 and routing_big.nbytes == 2 * 8 * 2 * 2 * 2
    assert torch.equal(routing_big.indices[:, :, 0].reshape(-1, 2).long(), raw[0])  # indices >= 256 survive
    # a valid mask costs one byte per position
    masked = Routing(routing.indices, routing.layers, 8, torch.ones(4, 16, dtype=torch.bool).tril())
    assert masked.nbytes == routing.nbytes + 4 * 16
    assert masked[1:3].shape == (2, 16, 2, 2) and torch.equal(masked[1:3].valid, masked.valid[1:3])


def test_flip_rate_compares_sets_per_token():
    layers, k = (0,), 2
    a = Routing(torch.tensor([[[[0, 1]], [[2, 3]], [[4, 5]]]]), layers, 8)  # [1, 3, 1, 2]
    assert flip_rate(a, Routing(torch.tensor([[[[1, 0]], [[3, 2]], [[5, 4]]]]), layers, 8)) == 0.0  # order only
    b = Routing(torch.tensor([[[[0, 7]], [[2, 3]], [[6, 7]]]]), layers, 8)
    assert flip_rate(a, b) == pytest.approx(3 / 6)
    assert flip_rate(a, b, torch.tensor([[1, 1, 0]])) == pytest.approx(1 / 4)
    b_partial = Routing(b.indices, layers, 8, torch.tensor([[True, True, False]]))  # invalid positions not counted
    assert flip_rate(a, b_partial) == pytest.approx(1 / 4)
    assert flip_rate(a, b, torch.zeros(1, 3)) == 0.0
    assert k == a.top_k


def test_flip_rate_per_layer_is_keyed_by_decoder_layer():
    layers = (1, 3)  # decoder-layer indices, not positions 0, 1
    # [1, 3, 2, 2]: position, then layer 1's and layer 3's two experts
    a = Routing(torch.tensor([[[[0, 1], [4, 5]], [[2, 3], [6, 7]], [[4, 5], [0, 1]]]]), layers, 8)
    b = Routing(torch.tensor([[[[1, 0], [4, 6]], [[2, 3], [0, 1]], [[5, 7], [1, 0]]]]), layers, 8)
    # flips: layer 1 -> 0, 0, 1 (expert 4); layer 3 -> 1 (expert 5), 2, 0 (order only)
    assert flip_rate_per_layer(a, b) == {1: pytest.approx(1 / 6), 3: pytest.approx(3 / 6)}
    assert flip_rate(a, b) == pytest.approx(4 / 12)
    assert flip_rate_per_layer(a, b, torch.tensor([[1, 1, 0]])) == {1: 0.0, 3: pytest.approx(3 / 4)}
    b_partial = Routing(b.indices, layers, 8, torch.tensor([[False, True, True]]))  # same set semantics as flip_rate
    assert flip_rate_per_layer(a, b_partial) == {1: pytest.approx(1 / 4), 3: pytest.approx(2 / 4)}
    assert flip_rate_per_layer(a, b, torch.zeros(1, 3)) == {1: 0.0, 3: 0.0}
    with pytest.raises(ValueError, match="do not match"):
        flip_rate_per_layer(a, Routing(b.indices, (0, 1), 8))


def test_flip_rate_per_layer_averages_to_flip_rate_on_a_model():
    model = tiny(num_hidden_layers=3, mlp_only_layers=[1])  # MoE layers 0 and 2
    x = tokens()
    with torch.no_grad(), record_routing(model) as old:
        model(input_ids=x)
    adamw_step(model, x, lr=3e-2)
    with torch.no_grad(), record_routing(model) as fresh:
        model(input_ids=x)
    mask = torch.ones_like(x)
    mask[:, -4:] = 0
    per_layer = flip_rate_per_layer(old, fresh, mask)
    assert sorted(per_layer) == [0, 2]
    assert any(rate > 0 for rate in per_layer.values())
    assert sum(per_layer.values()) / 2 == pytest.approx(flip_rate(old, fresh, mask), abs=1e-12)


# -- Rollout Routing Replay (R3): the HF engine's routing --------------------------------------------------------


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    from rlzoo.config.schema import TinyModelConfig
    from rlzoo.engines import EngineContext
    from rlzoo.engines.base import SamplingSettings
    from rlzoo.engines.hf_rollout import HFRolloutEngine
    from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model

    directory = tmp_path_factory.mktemp("moe") / "m"
    tokenizer = build_char_tokenizer("0123456789+=")
    config = TinyModelConfig(
        hidden_size=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    save_model(build_tiny_model(config, tokenizer), tokenizer, directory)
    engine = HFRolloutEngine(HFRolloutEngine.Params(record_routing=True))
    engine.start(EngineContext(directory, pad_token_id=0, eos_token_id=1))
    prompts = [
        tokenizer(p)["input_ids"] for p in ("1+2=", "12+34=", "7=", "99+1+2=")
    ]  # different lengths: left padding
    groups = engine.generate(prompts, SamplingSettings(n=4, max_new_tokens=12, seed=0))
    generations = [g for group in groups for g in group]
    model, _ = load_model(directory)
    model.eval()
    batch = make_token_batch([g.prompt_ids for g in generations], [g.response_ids for g in generations], 0)
    return generations, model, batch


def test_hf_rollout_records_routing_in_training_positions(rollout):
    generations, model, batch = rollout
    assert len({len(g.response_ids) for g in generations}) > 1  # some responses ended early
    for g in generations:
        assert g.routing is not None and g.routing.dtype == torch.uint8
        assert tuple(g.routing.shape) == (len(g.prompt_ids) + len(g.response_ids) - 1, 2, 2)
    routing = routing_for_batch([g.routing for g in generations], batch, model)
    lengths = batch.attention_mask.sum(1)
    for row, n in enumerate(lengths.tolist()):
        assert routing.valid[row, : n - 1].all() and not routing.valid[row, n - 1 :].any()  # last token + padding


def test_hf_rollout_routing_agrees_with_the_training_forward(rollout):
    generations, model, batch = rollout
    routing = routing_for_batch([g.routing for g in generations], batch, model)
    with torch.no_grad(), record_routing(model) as fresh:
        logp = response_logprobs(model, batch)
    disagreement = flip_rate(routing, fresh, batch.attention_mask)
    assert disagreement <= 0.01, disagreement  # fp32, same weights: ~100% agreement (measured: 0 flips)
    # a misaligned capture (off by one position) would disagree a lot: the check can fail
    shifted = Routing(torch.roll(routing.indices, 1, dims=1), routing.layers, 8, routing.valid)
    assert flip_rate(shifted, fresh, batch.attention_mask) > 0.1
    # replaying the rollout routing: the training forward uses exactly the rollout's experts
    with torch.no_grad(), replay_routing(model, routing), record_routing(model) as used:
        replayed = response_logprobs(model, batch)
    assert flip_rate(routing, used, batch.attention_mask) == 0.0
    assert torch.allclose(replayed, logp, atol=1e-5)
    rollout_logp = torch.zeros_like(logp)
    for row, g in enumerate(generations):
        rollout_logp[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs)
    assert (replayed - rollout_logp).abs().max() < 1e-4


def test_rollout_routing_replays_after_the_policy_moved(rollout):
    generations, model, batch = rollout
    model = type(model)(model.config)
    model.load_state_dict(rollout[1].state_dict())
    routing = routing_for_batch([g.routing for g in generations], batch, model)
    adamw_step(model, batch.input_ids, lr=1e-2)
    with torch.no_grad(), record_routing(model) as fresh:
        response_logprobs(model, batch)
    assert flip_rate(routing, fresh, batch.attention_mask) > 0.0
    with torch.no_grad(), replay_routing(model, routing), record_routing(model) as used:
        response_logprobs(model, batch)
    assert flip_rate(routing, used, batch.attention_mask) == 0.0
    # positions without a record (last token, padding) were routed afresh, i.e. like the fresh pass in layer 0
    invalid = ~routing.valid
    assert torch.equal(used.indices[:, :, 0][invalid], fresh.indices[:, :, 0][invalid])


def test_routing_for_batch_checks_shapes(rollout):
    generations, model, batch = rollout
    routings = [g.routing for g in generations]
    with pytest.raises(RoutingError, match="row 0"):
        routing_for_batch([routings[0][:-1], *routings[1:]], batch, model)
    with pytest.raises(RoutingError, match="row 2 has no rollout routing"):
        routing_for_batch([*routings[:2], None, *routings[3:]], batch, model)
    partial = routing_for_batch([*routings[:2], None, *routings[3:]], batch, model, allow_missing=True)
    assert not partial.valid[2].any()


def test_replay_drives_the_deepspeed_moe_block():
    """rlzoo.models.deepspeed_moe keeps the HF router as ``mlp.gate``: the same hooks replay the DeepSpeed path."""
    pytest.importorskip("deepspeed")
    from rlzoo.models.deepspeed_moe import convert_to_deepspeed_moe

    hf, ds = tiny(), tiny()
    assert convert_to_deepspeed_moe(ds) == 2
    assert [r.name for r in find_routers(ds)] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    x = tokens()
    with torch.no_grad(), record_routing(hf) as old:
        hf(input_ids=x)
    adamw_step(hf, x)
    adamw_step(ds, x)
    with torch.no_grad(), replay_routing(hf, old):
        expected = hf(input_ids=x).logits
    ds.train()
    with replay_routing(ds, old) as replay, record_routing(ds) as used:
        logits = ds(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
    assert flip_rate(old, used) == 0.0 and flip_rate(old, replay.fresh) > 0.0
    assert torch.allclose(logits, expected, atol=1e-5)
    assert all(r.module.weight.grad.abs().sum() > 0 for r in find_routers(ds))
