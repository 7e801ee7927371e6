"""Per-token entropy of the full distribution: equals the naive formula, bounded extra memory, both engine paths."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.tokens import logprobs_from_logits, make_token_batch, response_positions
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

B, P, T, V = 6, 3, 5, 50


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, V, (P,), generator=g).tolist() for _ in range(B)]
    responses = [torch.randint(2, V, (1 + i % T,), generator=g).tolist() for i in range(B)]
    batch = make_token_batch(prompts, responses, 0, response_width=T)
    logits = torch.randn(B, batch.input_ids.shape[1], V, generator=g) * 3
    return batch, logits


def _naive(logits: torch.Tensor, batch):
    """The textbook formula on the whole batch: one [B, T, V] log_softmax."""
    positions = response_positions(batch)
    picked = torch.gather(logits, 1, positions.unsqueeze(-1).expand(-1, -1, V))
    logp_all = torch.log_softmax(picked, dim=-1)
    targets = torch.gather(batch.input_ids, 1, (positions + 1).clamp(max=batch.input_ids.shape[1] - 1))
    logp = torch.gather(logp_all, 2, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp * batch.response_mask, entropy * batch.response_mask


@pytest.mark.parametrize("chunk_rows", [1, 4, 100])
def test_chunked_logprobs_and_entropy_equal_the_naive_formula(chunk_rows):
    batch, logits = _inputs()
    want_logp, want_entropy = _naive(logits, batch)
    logp, entropy = logprobs_from_logits(logits, batch.input_ids, batch, entropy=True, chunk_rows=chunk_rows)
    assert torch.equal(logp, want_logp)  # log_softmax is per row: chunking changes nothing
    assert torch.allclose(entropy, want_entropy, atol=1e-5)
    assert (entropy[batch.response_mask > 0] > 0).all() and (entropy[batch.response_mask == 0] == 0).all()
    # a uniform distribution has the maximal entropy log V
    _, flat = logprobs_from_logits(torch.zeros_like(logits), batch.input_ids, batch, entropy=True)
    valid = flat[batch.response_mask > 0]
    assert torch.allclose(valid, torch.full_like(valid, torch.log(torch.tensor(float(V))).item()))


def test_chunked_entropy_gradient_equals_the_naive_gradient():
    batch, logits = _inputs(1)
    weights = torch.randn(B, T)
    a = logits.clone().requires_grad_(True)
    logp, entropy = logprobs_from_logits(a, batch.input_ids, batch, entropy=True, chunk_rows=2)
    ((logp + entropy) * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    want_logp, want_entropy = _naive(b, batch)
    ((want_logp + want_entropy) * weights).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5)


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any operation allocates (in elements) while active; views of inputs (slices,
    expands) allocate nothing and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


@pytest.mark.parametrize("grad", [False, True])
def test_extra_memory_is_bounded_by_one_chunk(grad):
    """No operation creates a tensor larger than one chunk's [chunk, T, V] (the naive formula creates [B, T, V]
    ones), and with gradient what autograd keeps for backward is no larger either (checkpointed chunks)."""
    batch, logits = _inputs(2)
    logits.requires_grad_(grad)
    chunk = 2
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():  # views of the logits: no extra
            saved.append(t.numel())
        return t

    with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with _LargestOutput() as watch:
            logprobs_from_logits(logits, batch.input_ids, batch, entropy=True, chunk_rows=chunk)
    assert watch.largest <= chunk * T * V < B * T * V
    assert sum(saved) <= 4 * B * T  # only [B, T]-sized bookkeeping is kept for backward, no [.., V] tensor

    saved.clear()
    with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with _LargestOutput() as watch:
            _naive(logits, batch)
    assert watch.largest >= B * T * V  # the measurement can fail: the naive formula does exceed the bound
    if grad:
        assert sum(saved) >= B * T * V


def test_torch_engine_returns_entropy_in_both_passes(tmp_path):
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    engine = TorchTrainingEngine()
    engine.start(EngineContext(tmp_path / "m", pad_token_id=0, eos_token_id=1), TrainerConfig(lr=1e-4))
    batch = make_token_batch(
        [tokenizer("1+2=")["input_ids"], tokenizer("3+4=")["input_ids"]],
        [tokenizer("3")["input_ids"] + [1], tokenizer("7")["input_ids"]],
        0,
    )
    logp, entropy = engine.logprobs_and_entropy(batch)
    assert torch.equal(logp, engine.logprobs(batch))
    assert (entropy[batch.response_mask > 0] > 0).all() and (entropy[batch.response_mask == 0] == 0).all()
    seen = {}

    def loss_fn(logp, entropy):
        seen["entropy"] = entropy.detach()
        assert entropy.requires_grad
        return -entropy.sum(), {}

    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert engine.train_step(batch, loss_fn, with_entropy=True)["train/nonfinite_steps"] == 0.0
    assert torch.allclose(seen["entropy"], entropy, atol=1e-6)
    assert any(not torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    # maximising entropy moved the distribution towards uniform
    assert engine.logprobs_and_entropy(batch)[1].sum() > entropy.sum()
