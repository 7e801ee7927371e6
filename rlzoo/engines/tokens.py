"""Padding token sequences into a :class:`TokenBatch` and computing response-token log-probs and entropies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlzoo.engines.base import TokenBatch

#: rows per chunk of the log-prob / entropy computation (bounds its extra memory at [chunk, T, vocab])
ENTROPY_CHUNK_ROWS = 4


def make_token_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    response_width: int | None = None,
    policy_masks: Sequence[Sequence[int] | None] | None = None,
) -> TokenBatch:
    """Right-pad ``prompt + response`` rows into the narrowest input that holds every row.

    ``response_width`` fixes the response columns of ``response_mask`` (>= the longest response): objectives that
    normalise by that width (``seq-mean-token-sum-norm``) see ``max_new_tokens`` columns whatever was sampled. The
    model input stays as wide as the longest ``prompt + response``: columns past it would be padding that every
    forward and backward pays for, and they change no response token's log-prob (the model is causal and each
    padded column is masked).

    ``policy_masks`` (one per row, ``None`` for all ones) zero the response mask on an episode's observation
    tokens: they stay in the input, and no loss, ratio, aggregation or KL counts them."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses differ in length")
    width = max((len(r) for r in responses), default=0)
    if response_width is not None:
        if response_width < width:
            raise ValueError(f"response_width {response_width} < longest response {width}")
        width = response_width
    total = max((len(p) + len(r) for p, r in zip(prompts, responses, strict=True)), default=0)
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
        mask = policy_masks[row] if policy_masks is not None else None
        if mask is None:
            response_mask[row, : len(response)] = 1.0
        else:
            if len(mask) != len(response):
                raise ValueError(f"row {row}: a policy mask of {len(mask)} for a response of {len(response)} tokens")
            response_mask[row, : len(response)] = torch.tensor(list(mask), dtype=torch.float32)
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
    return response_logprobs_and_entropy(model, batch, entropy=False)[0]


def response_logprobs_and_entropy(
    model: torch.nn.Module, batch: TokenBatch, entropy: bool = True, chunk_rows: int = ENTROPY_CHUNK_ROWS
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` log-probs of the response tokens and, if ``entropy``, ``[B, T]`` entropies of the full next-token
    distribution (0 at masked positions); see :func:`logprobs_from_logits`."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    logits = model(input_ids=input_ids, attention_mask=batch.attention_mask.to(device)).logits
    return logprobs_from_logits(logits, input_ids, batch, entropy, chunk_rows)


def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    batch: TokenBatch,
    entropy: bool = False,
    chunk_rows: int = ENTROPY_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled-token log-probs and (optionally) entropies from ``[B, L, V]`` logits, ``chunk_rows`` rows at a time.

        logp_t = log_softmax(z_t)[y_t]            H_t = -sum_v p_v log p_v,  p = softmax(z_t)

    Memory: the model's logits are the only ``[B, L, V]`` tensor. Each chunk gathers its rows' response positions
    (``[chunk, T, V]``), takes ``log_softmax`` in fp32 and reduces it, so the extra memory of one call is bounded by
    a chunk's ``[chunk, T, V]`` (twice: log-probs and probabilities), not the batch's. With gradient and
    ``entropy``, each chunk runs under activation checkpointing: backward recomputes the chunk instead of keeping
    its ``[chunk, T, V]`` softmax alive until then, so the saved memory is bounded by a chunk too. ``log_softmax``
    is per row, so the log-probs equal the unchunked computation's exactly.
    """
    mask = batch.response_mask.to(logits.device)
    width, live = mask.shape[1], live_columns(mask)
    # columns past the longest response are masked in every row: their log-probs are 0 without computing them
    positions = response_positions(batch).to(logits.device)[:, :live]
    targets = torch.gather(input_ids, 1, (positions + 1).clamp(max=input_ids.shape[1] - 1))
    mask = mask[:, :live]
    logps, entropies = [], []
    for start in range(0, logits.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        if entropy and torch.is_grad_enabled() and logits.requires_grad:
            from torch.utils.checkpoint import checkpoint

            logp, ent = checkpoint(_chunk, logits[rows], positions[rows], targets[rows], True, use_reentrant=False)
        else:
            logp, ent = _chunk(logits[rows], positions[rows], targets[rows], entropy)
        logps.append(logp)
        entropies.append(ent)
    pad = (0, width - live)
    logp = torch.nn.functional.pad(torch.cat(logps) * mask, pad)
    return logp, (torch.nn.functional.pad(torch.cat(entropies) * mask, pad) if entropy else None)


def live_columns(mask: torch.Tensor) -> int:
    """How many leading columns of a ``[B, T]`` response mask hold a response token in some row."""
    nonzero = (mask != 0).any(dim=0).nonzero()
    return int(nonzero.max()) + 1 if len(nonzero) else 0


def _chunk(
    logits: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # only the rows that predict response tokens go through log_softmax: the vocabulary can be large
    picked = torch.gather(logits, 1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    logp_all = torch.log_softmax(picked.float(), dim=-1)
    logp = torch.gather(logp_all, 2, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logp, None
    return logp, -(logp_all.exp() * logp_all).sum(dim=-1)


def hidden_logprobs(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, entropy: bool, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N]`` log-probs of ``targets`` and, if ``entropy``, ``[N]`` entropies, from the last hidden states
    ``[N, H]`` through the output layer ``head``, ``chunk_tokens`` positions at a time.

        z = head(h)        logp = log_softmax(z)[y]        H = -sum_v p_v log p_v

    No ``[N, vocab]`` tensor exists: each chunk projects to the vocabulary, takes ``log_softmax`` (in at least fp32)
    and reduces it. With gradient, each chunk runs under activation checkpointing, so backward recomputes the
    chunk's ``[chunk, vocab]`` logits instead of keeping every chunk's alive: the largest extra tensor of the whole
    computation is one chunk's. Each position is independent, so chunking changes no value.
    """
    logps, entropies = [], []
    checkpointed = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[0], chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        if checkpointed:
            from torch.utils.checkpoint import checkpoint

            logp, ent = checkpoint(_head_chunk, hidden[piece], head, targets[piece], entropy, use_reentrant=False)
        else:
            logp, ent = _head_chunk(hidden[piece], head, targets[piece], entropy)
        logps.append(logp)
        entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, (empty if entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if entropy else None)


def _head_chunk(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head(hidden)  # [chunk, vocab]
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    logp = torch.gather(logp_all, 1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logp, None
    return logp, -(logp_all.exp() * logp_all).sum(dim=-1)


def hidden_sum_pi_squared(hidden: torch.Tensor, head: torch.nn.Module, chunk_tokens: int) -> torch.Tensor:
    """``[N]`` ``sum_v pi(v)^2`` of the next-token distribution ``pi = softmax(head(h))`` at each of the ``[N, H]``
    hidden states, ``chunk_tokens`` positions at a time (no ``[N, vocab]`` tensor; at least fp32). The squared norm
    of a softmax's gradient is ``1 - 2 pi(y) + sum_v pi(v)^2``: the optimal token baseline reads this statistic."""
    sums = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        logits = head(hidden[start : start + chunk_tokens])
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        sums.append((probs * probs).sum(dim=-1))
    if not sums:
        return hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(sums)
