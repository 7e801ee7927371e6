"""Padding token sequences into a :class:`TokenBatch` and computing response-token log-probs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlzoo.engines.base import TokenBatch


def make_token_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    response_width: int | None = None,
) -> TokenBatch:
    """Right-pad ``prompt + response`` rows. ``response_width`` fixes the response columns (>= longest)."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses differ in length")
    width = max((len(r) for r in responses), default=0)
    if response_width is not None:
        if response_width < width:
            raise ValueError(f"response_width {response_width} < longest response {width}")
        width = response_width
    total = max(len(p) + width for p in prompts)
    batch = len(prompts)
    input_ids = torch.full((batch, total), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, total), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.float32)
    starts = torch.zeros(batch, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if len(prompt) == 0:
            raise ValueError("empty prompt: a response token needs a preceding token to be predicted from")
        seq = list(prompt) + list(response)
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
        starts[row] = len(prompt)
        response_mask[row, : len(response)] = 1.0
    return TokenBatch(input_ids, attention, starts, response_mask)


def select_rows(batch: TokenBatch, rows: torch.Tensor | slice) -> TokenBatch:
    return TokenBatch(
        batch.input_ids[rows], batch.attention_mask[rows], batch.response_start[rows], batch.response_mask[rows]
    )


def response_positions(batch: TokenBatch) -> torch.Tensor:
    """``[B, T]`` index of the logit row that predicts response token ``t`` (clamped where masked)."""
    width = batch.response_mask.shape[1]
    offsets = torch.arange(width, device=batch.input_ids.device)
    positions = batch.response_start.unsqueeze(1) - 1 + offsets.unsqueeze(0)
    return positions.clamp(max=batch.input_ids.shape[1] - 1)


def response_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Log-probs (temperature 1) of each response token under ``model``; 0 at masked positions."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    logits = model(input_ids=input_ids, attention_mask=batch.attention_mask.to(device)).logits
    positions = response_positions(batch).to(device)
    # only the rows that predict response tokens go through log_softmax: the vocabulary can be large
    picked = torch.gather(logits, 1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    logp_all = torch.log_softmax(picked.float(), dim=-1)
    targets = torch.gather(input_ids, 1, (positions + 1).clamp(max=input_ids.shape[1] - 1))
    logp = torch.gather(logp_all, 2, targets.unsqueeze(-1)).squeeze(-1)
    return logp * batch.response_mask.to(device)
