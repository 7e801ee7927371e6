"""Micro-batches under a token budget: every pass equals one pass over the whole batch.

The plan covers every response token once and keeps each forward within the budget; packed and length-sorted
micro-batches give the one-pass log-probs and entropies; and a minibatch's gradient accumulated over micro-batches
equals one pass's, to 1e-6 in float64, for every aggregation, the sequence ratio, batch-level clippers (KL-Cov,
Clip-Cov, GMPO), the entropy regulariser and the MoE aux loss.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.micro_batches import padding_fraction, plan_micro_batches
from rlzoo.engines.tokens import make_token_batch, response_logprobs_and_entropy, response_positions
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

ALPHABET = "0123456789+="


def _batch(rows: int, seed: int = 0, vocab: int = 12):
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(2, vocab, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(rows)
    ]
    responses = [
        torch.randint(2, vocab, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(rows)
    ]
    return make_token_batch(prompts, responses, 0, response_width=10)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=12),
    budget=st.integers(1, 64),
    pack=st.booleans(),
)
def test_plan_covers_every_response_token_once_within_the_budget(lengths, budget, pack):
    batch = make_token_batch([[5] * p for p, _ in lengths], [[6] * r for _, r in lengths], 0)
    plan = plan_micro_batches(batch, budget, pack)
    covered = torch.zeros_like(batch.response_mask)
    for mb in plan:
        covered[mb.out_row, mb.out_col] += 1
        sequences = int(mb.source_pos.eq(0).logical_and(mb.source_row >= 0).sum())
        assert mb.padded_tokens <= budget or sequences == 1  # only a sequence longer than the budget exceeds it
        assert torch.equal(mb.input_ids.reshape(-1)[mb.predict + 1], mb.target)  # the next position is the target
        real = mb.source_row >= 0
        assert torch.equal(mb.input_ids[real], batch.input_ids[mb.source_row[real], mb.source_pos[real]])
    assert torch.equal(covered, batch.response_mask)
    assert 0.0 <= padding_fraction(plan) < 1.0


def test_packing_removes_padding():
    # sequences of 12, 2, 11, 10, 2 and 1 tokens: packed rows of 12 hold [12], [11, 1], [10, 2], [2]
    batch = make_token_batch([[5] * 1] * 6, [[6] * n for n in (11, 1, 10, 9, 1, 0)], 0)
    sorted_only = padding_fraction(plan_micro_batches(batch, 1000, pack=False))
    packed = padding_fraction(plan_micro_batches(batch, 1000, pack=True))
    assert sorted_only > 0.4 and packed < sorted_only / 2


def _engine(tmp_path, moe: bool, **trainer):
    tokenizer = build_char_tokenizer(ALPHABET)
    tiny = TinyModelConfig(architecture="qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    if moe:
        tiny = TinyModelConfig(
            hidden_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
        )
    folder = tmp_path / ("moe" if moe else "dense")
    if not folder.exists():
        save_model(build_tiny_model(tiny, tokenizer), tokenizer, folder)
    engine = TorchTrainingEngine(TorchTrainingEngine.Params(aux_loss_coef=0.01 if moe else 0.0))
    engine.start(EngineContext(folder, pad_token_id=0, eos_token_id=1), TrainerConfig(lr=1e-2, **trainer))
    engine.model.double()  # float64: the comparisons below are about the algebra, not rounding
    engine.model.config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    return engine


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("pack", [False, True], ids=["sorted", "packed"])
def test_micro_batched_logprobs_and_entropy_equal_one_pass(tmp_path, moe, pack):
    engine = _engine(tmp_path, moe, max_tokens_per_micro_batch=24, packing=pack, logits_chunk_tokens=5)
    batch = _batch(9)
    assert len(engine._plan(batch)) > 2
    logp, entropy = engine.logprobs_and_entropy(batch)
    with torch.no_grad():
        reference_logp, reference_entropy = response_logprobs_and_entropy(engine.model, batch)
    assert logp.dtype == torch.float64
    # the one-pass reference takes log_softmax in float32
    assert (logp - reference_logp).abs().max() < 1e-6
    assert (entropy - reference_entropy).abs().max() < 1e-6


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("pack", [False, True], ids=["sorted", "packed"])
def test_micro_batched_sum_pi_squared_equals_the_full_logits(tmp_path, moe, pack):
    """sum_v pi(v)^2 at each response position (the optimal token baseline's statistic), in micro-batches and
    output-layer chunks, against softmax over the whole [B, L, V] logits of one forward."""
    engine = _engine(tmp_path, moe, max_tokens_per_micro_batch=24, packing=pack, logits_chunk_tokens=5)
    batch = _batch(9)
    assert len(engine._plan(batch)) > 2
    sums = engine.token_stats(batch, ["sum_pi_squared"])["sum_pi_squared"]
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    squares = (torch.softmax(logits.double(), dim=-1) ** 2).sum(dim=-1)  # [B, L]
    expected = torch.gather(squares, 1, response_positions(batch)) * batch.response_mask
    assert sums.dtype == torch.float64 and sums.shape == batch.response_mask.shape
    assert (sums - expected).abs().max() < 1e-10
    assert ((sums > 0) == (batch.response_mask > 0)).all()  # every response position, nothing else


OBJECTIVES = {
    "token-mean": {"aggregation": {"name": "token-mean"}},
    "seq-mean-token-mean": {"aggregation": {"name": "seq-mean-token-mean"}},
    "seq-mean-token-sum": {"aggregation": {"name": "seq-mean-token-sum"}},
    "seq-mean-token-sum-norm": {"aggregation": {"name": "seq-mean-token-sum-norm"}},
    "sequence-ratio": {"ratio": {"name": "sequence"}, "clipper": {"name": "ppo", "eps_low": 0.01, "eps_high": 0.01}},
    "kl-cov": {"clipper": {"name": "kl-cov", "select_fraction": 0.2}},
    "clip-cov": {"clipper": {"name": "clip-cov", "select_fraction": 0.2, "lb": -5.0, "ub": 5.0}},
    "gmpo": {"clipper": {"name": "gmpo"}},
    "entropy": {"regularisers": [{"name": "entropy", "coef": 0.1}]},
}


def _gradient(engine, batch, objective, old_logp, advantages):
    engine.model.zero_grad(set_to_none=True)

    def loss_fn(logp, entropy=None):
        return objective(logp, old_logp, advantages, batch.response_mask, seed=3, entropy=entropy)

    metrics = engine.accumulate_gradients(batch, loss_fn, objective.needs_entropy)
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    return metrics, grads


CASES = [(name, False) for name in OBJECTIVES] + [(name, True) for name in ("token-mean", "sequence-ratio", "kl-cov")]


@pytest.mark.parametrize(("name", "moe"), CASES, ids=[f"{n}-{'moe' if m else 'dense'}" for n, m in CASES])
def test_accumulated_gradient_equals_one_pass(tmp_path, name, moe):
    objective = rlzoo.build_objective(OBJECTIVES[name])
    batch = _batch(10, seed=1)
    whole = _engine(tmp_path, moe, max_tokens_per_micro_batch=10_000)
    split = _engine(tmp_path, moe, max_tokens_per_micro_batch=20)
    g = torch.Generator().manual_seed(2)
    old_logp = whole.logprobs(batch) + 0.05 * torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
    advantages = torch.randn(batch.response_mask.shape[0], 1, generator=g, dtype=torch.float64).expand_as(old_logp)
    if name == "entropy":  # per-token advantages too
        advantages = advantages + 0.3 * torch.randn(old_logp.shape, generator=g, dtype=torch.float64)
    one, one_grads = _gradient(whole, batch, objective, old_logp, advantages.contiguous())
    many, many_grads = _gradient(split, batch, objective, old_logp, advantages.contiguous())
    assert one["train/micro_batches"] == 1 and many["train/micro_batches"] > 2
    assert abs(one["loss/total"] - many["loss/total"]) < 1e-6
    if moe:
        assert abs(one["train/aux_loss"] - many["train/aux_loss"]) < 1e-6
    assert one_grads.keys() == many_grads.keys() and one_grads
    for key, grad in one_grads.items():
        assert (grad - many_grads[key]).abs().max() < 1e-6, key
    assert any(g.abs().max() > 1e-4 for g in one_grads.values())  # a gradient that can differ


def test_activation_checkpointing_changes_no_gradient(tmp_path):
    objective = rlzoo.build_objective({"clipper": {"name": "ppo"}})
    batch = _batch(6, seed=4)
    plain = _engine(tmp_path, True, max_tokens_per_micro_batch=20)
    checkpointed = _engine(tmp_path, True, max_tokens_per_micro_batch=20, activation_checkpointing=True)
    old_logp = plain.logprobs(batch)
    advantages = torch.linspace(-1, 1, 6, dtype=torch.float64).unsqueeze(1).expand_as(old_logp).contiguous()
    _, a = _gradient(plain, batch, objective, old_logp, advantages)
    _, b = _gradient(checkpointed, batch, objective, old_logp, advantages)
    for key in a:
        assert (a[key] - b[key]).abs().max() < 1e-10, key


@pytest.mark.parametrize("pack", [False, True], ids=["sorted", "packed"])
def test_routing_replay_across_micro_batches(tmp_path, pack):
    """R2 on packed / reordered micro-batches: the old pass's experts are recorded in the batch's own layout, and
    after an optimizer step the update passes replay them exactly (flip rate 0), as with one pass."""
    from rlzoo.registry import default_registry
    from rlzoo.rl.routing_learner import RoutingLearner

    engine = _engine(tmp_path, True, max_tokens_per_micro_batch=20, packing=pack)
    engine.model.float()
    learner = RoutingLearner(engine, default_registry().create("router", "replay-old", {}))
    batch = _batch(8, seed=5)
    assert len(engine._plan(batch)) > 2
    rollout_logp = torch.zeros(batch.response_mask.shape)
    old_logp, _ = learner.old_logprobs(batch, rollout_logp, [None] * 8)
    recorded = learner.recorded.old
    assert recorded.batch_size == 8 and bool(recorded.valid_mask()[batch.attention_mask.bool()].all())
    with torch.no_grad():  # the experts the model chooses itself, one pass over the whole batch
        from rlzoo.moe import record_routing

        with record_routing(engine.model) as fresh:
            response_logprobs_and_entropy(engine.model, batch)
    real = batch.attention_mask.bool()
    assert torch.equal(recorded.indices[real], fresh.indices[real])
    objective = rlzoo.build_objective({"clipper": {"name": "ppo"}})
    advantages = torch.linspace(-1, 1, 8).unsqueeze(1).expand_as(old_logp).contiguous()
    rows = torch.arange(8)
    loss_fn = lambda logp: objective(logp, old_logp, advantages, batch.response_mask)  # noqa: E731
    first = learner.update(batch, rows, loss_fn)
    second = learner.update(batch, rows, loss_fn)  # after a step of lr 1e-2: fresh routing would flip
    assert first["moe/flip_rate"] == 0.0 and second["moe/flip_rate"] == 0.0
    assert second["moe/fresh_flip_rate"] > 0.0


def test_chunked_logprobs_have_the_gradient_of_full_vocabulary_logits(tmp_path):
    """Log-probs and entropies through the output layer in chunks of 3 positions (recomputed in backward) give the
    parameters the gradient of the full [rows, length, vocab] logits computation, to 1e-6 relative (the full-logits
    reference takes log_softmax in float32)."""
    engine = _engine(tmp_path, False, logits_chunk_tokens=3)
    batch = _batch(6, seed=6)
    g = torch.Generator().manual_seed(1)
    w_logp = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64) * batch.response_mask
    w_entropy = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64) * batch.response_mask

    def grads(loss):
        engine.model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}

    logp, entropy = response_logprobs_and_entropy(engine.model, batch)  # full logits (log_softmax in float32)
    reference = grads((logp.double() * w_logp).sum() + (entropy.double() * w_entropy).sum())
    seen = {}

    def loss_fn(logp, entropy):
        seen["loss"] = (logp * w_logp).sum() + (entropy * w_entropy).sum()
        return seen["loss"], {}

    engine.model.zero_grad(set_to_none=True)
    engine.accumulate_gradients(batch, loss_fn, with_entropy=True)
    chunked = {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    assert chunked.keys() == reference.keys()
    for key, grad in reference.items():
        assert (grad - chunked[key]).abs().max() < 1e-6 * max(1.0, float(grad.abs().max())), key


def test_gradients_without_a_step_equal_the_accumulated_gradients(tmp_path):
    """``TrainingEngine.gradients``: each loss's gradient, from one forward per micro-batch, equals what a step would
    accumulate for that loss alone (identity projection), and leaves the weights, ``.grad`` and the optimizer alone."""
    from rlzoo.engines import GradientRequest

    engine = _engine(tmp_path, False, max_tokens_per_micro_batch=20)
    batch = _batch(8, seed=7)
    assert len(engine._plan(batch)) > 2
    g = torch.Generator().manual_seed(4)
    old_logp = engine.logprobs(batch) + 0.05 * torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
    advantages = torch.randn(8, 1, generator=g, dtype=torch.float64).expand_as(old_logp).contiguous()
    objectives = [rlzoo.build_objective(OBJECTIVES[name]) for name in ("sequence-ratio", "entropy")]
    expected = [_gradient(engine, batch, objective, old_logp, advantages)[1] for objective in objectives]
    engine.model.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in engine.model.parameters()]
    trained = [(n, p) for n, p in engine.model.named_parameters() if p.requires_grad]

    def loss_of(objective):
        return lambda logp, entropy=None: objective(
            logp, old_logp, advantages, batch.response_mask, seed=3, entropy=entropy
        )

    def flat(grads):  # the identity as projection (linear: the engine adds the micro-batches' parts)
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, (_, p) in zip(grads, trained)])

    got = engine.gradients(batch, GradientRequest([loss_of(o) for o in objectives], flat, with_entropy=True))
    for grad, reference in zip(got, expected, strict=True):
        assert (grad - flat([reference.get(n) for n, _ in trained])).abs().max() < 1e-9
        assert grad.abs().max() > 1e-4
    assert all(p.grad is None for p in engine.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(engine.model.parameters(), before, strict=True))
    assert not engine.optimizer.state  # no step was taken


DEEPSPEED_GRADIENTS = """
import sys
from pathlib import Path

import torch

import rlzoo
from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext, GradientRequest
from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
from rlzoo.engines.tokens import make_token_batch
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

root = Path(sys.argv[1])
tokenizer = build_char_tokenizer("0123456789+=")
tiny = TinyModelConfig(hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64)
save_model(build_tiny_model(tiny, tokenizer), tokenizer, root / "m")
context, trainer = EngineContext(root / "m", pad_token_id=0, eos_token_id=1), TrainerConfig(max_tokens_per_micro_batch=20)
engines = [TorchTrainingEngine(), DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(zero_stage=2, moe="deepspeed"))]
for engine in engines:
    engine.start(context, trainer)
batch = make_token_batch([[2, 3, 4]] * 6, [[5, 6, 7, 8][: 1 + i % 4] for i in range(6)], 0)
objective = rlzoo.build_objective({"preset": "gspo"})
advantages = torch.linspace(-1, 1, 6).unsqueeze(1).expand(batch.response_mask.shape).contiguous()
norms = []
for engine in engines:
    old = engine.logprobs(batch)
    loss = lambda logp, entropy=None: objective(logp, old, advantages, batch.response_mask)
    trained = engine._trained()
    flat = lambda g: torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1) for x, p in zip(g, trained)])
    (grad,) = engine.gradients(batch, GradientRequest([loss], flat))
    norms.append(grad.abs().sort().values)  # the same numbers, in each engine's own parameter layout
    before = [p.detach().clone() for p in engine.model.parameters()]
    metrics = engine.train_step(batch, loss)  # the engine's own step still works after
    moved = any(not torch.equal(p, q) for p, q in zip(engine.model.parameters(), before))
    print("step", engine.name, metrics["train/grad_norm"], moved)
print("norms", (norms[0] - norms[1]).abs().max().item(), norms[0].max().item())
"""


def test_the_deepspeed_engine_computes_gradients_through_its_bare_model(tmp_path):
    """DeepSpeed (ZeRO-2, DeepSpeed-MoE) computes the same per-parameter gradient norms as the torch engine on the same
    weights, without its engine's backward hooks reducing them into its partitions; a step works afterwards. A
    subprocess (DeepSpeed sets up a process group), ~30 s: the only check of DeepSpeed's gradients without a step."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", DEEPSPEED_GRADIENTS, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("step", "norms")))
    difference, largest = map(float, lines["norms"].split())
    assert largest > 1e-4 and difference < 1e-5 * largest, proc.stdout
    assert proc.stdout.count(" True\n") == 2, proc.stdout  # both engines' steps moved their weights
