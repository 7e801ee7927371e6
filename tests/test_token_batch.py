"""The training batch is as narrow as its longest row, and narrowing changes no log-prob, entropy or gradient."""

from __future__ import annotations

import torch

from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import TokenBatch
from rlzoo.engines.tokens import live_columns, logprobs_from_logits, make_token_batch, response_logprobs_and_entropy
from rlzoo.models import build_char_tokenizer, build_tiny_model

WIDTH = 12  # max_new_tokens: wider than any response below


def _rows():
    prompts = [[5, 6, 7], [5, 6], [8, 9, 10, 11], [4, 3]]  # ids inside the tiny tokenizer's vocabulary
    responses = [[12, 13, 1], [9], [10, 11, 12, 13, 1], []]
    return prompts, responses


def _widened(batch: TokenBatch, extra: int) -> TokenBatch:
    """The same rows with ``extra`` more padding columns on the right of the model input."""
    pad = lambda t: torch.nn.functional.pad(t, (0, extra))  # noqa: E731
    return TokenBatch(pad(batch.input_ids), pad(batch.attention_mask), batch.response_start, batch.response_mask)


def test_the_input_holds_the_longest_row_and_the_mask_keeps_its_width():
    prompts, responses = _rows()
    batch = make_token_batch(prompts, responses, 0, response_width=WIDTH)
    assert batch.input_ids.shape == (4, 9)  # 4 + 5: the longest prompt + response, not 4 + WIDTH
    assert batch.response_mask.shape == (4, WIDTH)
    assert batch.response_mask.sum(dim=1).tolist() == [3, 1, 5, 0]
    assert batch.attention_mask.sum(dim=1).tolist() == [6, 3, 9, 2]


def test_live_columns():
    assert live_columns(torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0]])) == 2
    assert live_columns(torch.tensor([[0.0, 0, 1, 0]])) == 3  # a hole does not end the live columns
    assert live_columns(torch.zeros(3, 4)) == 0
    assert live_columns(torch.ones(2, 4)) == 4


def test_skipping_dead_columns_equals_computing_them():
    prompts, responses = _rows()
    batch = make_token_batch(prompts, responses, 0, response_width=WIDTH)
    logits = torch.randn(4, batch.input_ids.shape[1], 20, generator=torch.Generator().manual_seed(0)) * 3
    logp, entropy = logprobs_from_logits(logits, batch.input_ids, batch, entropy=True)
    assert logp.shape == entropy.shape == (4, WIDTH)
    assert (logp[:, 5:] == 0).all() and (entropy[:, 5:] == 0).all()
    # the same rows with one live column more than needed: the shared columns are identical
    longer = TokenBatch(batch.input_ids, batch.attention_mask, batch.response_start, batch.response_mask.clone())
    longer.response_mask[3, 6] = 1.0  # row 3's column 6 predicts a padding token: computed, never read below
    logp_all, entropy_all = logprobs_from_logits(logits, batch.input_ids, longer, entropy=True)
    live = batch.response_mask > 0
    assert torch.equal(logp[live], logp_all[live]) and torch.equal(entropy[live], entropy_all[live])


def test_narrow_input_gives_the_wide_inputs_logprobs_and_gradients():
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    torch.manual_seed(0)
    model = build_tiny_model(tiny, tokenizer)
    prompts, responses = _rows()
    narrow = make_token_batch(prompts, responses, 0, response_width=WIDTH)
    wide = _widened(narrow, WIDTH)  # what a batch padded to prompt + max_new_tokens held before
    weights = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(1))
    results = []
    for batch in (narrow, wide):
        model.zero_grad()
        logp, entropy = response_logprobs_and_entropy(model, batch)
        ((logp + 0.1 * entropy) * weights).sum().backward()
        results.append(
            (logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        )
    (logp_n, ent_n, grads_n), (logp_w, ent_w, grads_w) = results
    assert logp_n.shape == logp_w.shape == (4, WIDTH)
    assert (logp_n[narrow.response_mask > 0] != 0).all()  # the comparison below compares real values
    torch.testing.assert_close(logp_n, logp_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_n, ent_w, atol=1e-6, rtol=0)
    assert len(grads_n) == len(grads_w) > 0
    for a, b in zip(grads_n, grads_w, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
