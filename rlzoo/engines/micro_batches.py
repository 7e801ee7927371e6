"""Cutting a batch into micro-batches under a token budget, packed where the model's attention allows it.

A micro-batch is one forward. Its padded size ``rows x width`` stays within ``max_tokens`` (a sequence longer than
the budget gets a micro-batch of its own), so the memory of a pass depends on the budget, not on the batch (verl's
dynamic batch size, ``ppo_max_token_len_per_gpu``).

Sequences are taken longest first. Without packing each sequence is one row, right-padded to the micro-batch's
longest: sorting by length keeps that padding small. With packing several sequences share a row: first-fit into
rows as wide as the micro-batch's longest sequence, position ids restarting at 0 for each sequence and no
attention mask, which transformers turns into a block-diagonal causal mask (``masking_utils`` detects the restarts;
sdpa, eager, flex and flash attention). Rows are never wider than the longest sequence, so attention costs no more
than unpacked rows do while the padded positions that every layer computes disappear.

Every micro-batch knows where each of its positions came from (``source_row`` / ``source_pos``), so per-token
results (log-probs, entropies, MoE routing) are scattered back to the batch's own ``[rows, positions]`` layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.engines.base import TokenBatch
from rlzoo.engines.tokens import response_positions

#: attention implementations whose masks honour packed position ids (transformers' masking_utils)
PACKABLE_ATTENTION = frozenset({"sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"})


@dataclass
class MicroBatch:
    """One forward over some rows of a :class:`TokenBatch` (``b`` model rows of ``width`` positions).

    input_ids, position_ids: ``[b, width]`` the model's input.
    attention_mask:          ``[b, width]``, or ``None`` when packed (the position ids delimit the sequences).
    source_row, source_pos:  ``[b, width]`` the batch row and position each input position holds (-1: padding).
    predict:                 ``[N]`` flat index into ``b * width`` of the position predicting each response token.
    target:                  ``[N]`` the predicted token ids.
    out_row, out_col:        ``[N]`` where each token's result goes in the batch's ``[rows, T]`` response layout.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    source_row: torch.Tensor
    source_pos: torch.Tensor
    predict: torch.Tensor
    target: torch.Tensor
    out_row: torch.Tensor
    out_col: torch.Tensor

    #: a stand-in forward (one padding token) that keeps the ranks' forward counts equal; its result is unused
    dummy: bool = False

    @property
    def token_mask(self) -> torch.Tensor:
        """``[b, width]`` 1 on real (non-padding) positions."""
        return (self.source_row >= 0).long()

    @property
    def real_tokens(self) -> int:
        return int((self.source_row >= 0).sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()


def plan_micro_batches(batch: TokenBatch, max_tokens: int, pack: bool) -> list[MicroBatch]:
    """The micro-batches of ``batch`` (see the module docstring); every row is in exactly one of them."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    groups: list[list[list[int]]] = []  # micro-batch -> model rows -> batch rows
    width = 0
    for row in order:
        length = max(int(lengths[row]), 1)
        current = groups[-1] if groups else None
        if current is not None:
            if pack:
                slot = next((r for r in current if _used(r, lengths) + length <= width), None)
                if slot is not None:
                    slot.append(row)
                    continue
            if (len(current) + 1) * width <= max_tokens:
                current.append([row])
                continue
        groups.append([[row]])
        width = length  # longest first: the first sequence of a micro-batch is its widest
    return [_build(batch, rows, lengths) for rows in groups]


def with_count(micro_batches: list[MicroBatch], count: int, pad_token_id: int) -> list[MicroBatch]:
    """``micro_batches`` followed by dummy micro-batches up to ``count``: with several processes every rank must run
    as many forwards and backwards (ZeRO-3 gathers parameters and expert parallelism exchanges tokens in each)."""
    return micro_batches + [_dummy(pad_token_id) for _ in range(count - len(micro_batches))]


def _dummy(pad_token_id: int) -> MicroBatch:
    one = torch.zeros((1, 2), dtype=torch.long)
    empty = torch.zeros(0, dtype=torch.long)
    return MicroBatch(
        one + pad_token_id,
        torch.ones_like(one),
        torch.arange(2).unsqueeze(0),
        one - 1,
        one - 1,
        torch.zeros(1, dtype=torch.long),
        torch.full((1,), pad_token_id, dtype=torch.long),
        empty,
        empty,
        dummy=True,
    )


def padding_fraction(micro_batches: list[MicroBatch]) -> float:
    """Share of the forwarded positions that are padding."""
    real = [mb for mb in micro_batches if not mb.dummy]
    padded = sum(mb.padded_tokens for mb in real)
    return 1.0 - sum(mb.real_tokens for mb in real) / padded if padded else 0.0


def _used(model_row: list[int], lengths: list[int]) -> int:
    return sum(max(int(lengths[r]), 1) for r in model_row)


def _build(batch: TokenBatch, model_rows: list[list[int]], lengths: list[int]) -> MicroBatch:
    width = max(_used(r, lengths) for r in model_rows)
    packed = any(len(r) > 1 for r in model_rows)
    shape = (len(model_rows), width)
    input_ids = torch.zeros(shape, dtype=batch.input_ids.dtype)
    position_ids = torch.zeros(shape, dtype=torch.long)
    source_row = torch.full(shape, -1, dtype=torch.long)
    source_pos = torch.full(shape, -1, dtype=torch.long)
    predicts, targets, out_rows, out_cols = [], [], [], []
    positions = response_positions(batch)  # [B, T] the batch position predicting each response token
    for model_row, rows in enumerate(model_rows):
        offset = 0
        for row in rows:
            length = int(lengths[row])
            span = slice(offset, offset + length)
            input_ids[model_row, span] = batch.input_ids[row, :length]
            position_ids[model_row, span] = torch.arange(length)
            source_row[model_row, span] = row
            source_pos[model_row, span] = torch.arange(length)
            columns = batch.response_mask[row].nonzero().squeeze(-1)
            predicts.append(model_row * width + offset + positions[row, columns])
            targets.append(batch.input_ids[row, positions[row, columns] + 1])
            out_rows.append(torch.full_like(columns, row))
            out_cols.append(columns)
            offset += length
        if offset < width:  # padding: a segment of its own, restarting at 0, attended by no real token
            position_ids[model_row, offset:] = torch.arange(width - offset)
            input_ids[model_row, offset:] = batch.input_ids[rows[0], 0]
    attention_mask = None if packed else (source_row >= 0).to(batch.attention_mask.dtype)
    return MicroBatch(
        input_ids,
        attention_mask,
        position_ids,
        source_row,
        source_pos,
        torch.cat(predicts),
        torch.cat(targets),
        torch.cat(out_rows),
        torch.cat(out_cols),
    )
