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

#: attention implementations whose masks honour packed position ids (transformers' masking_utils)
PACKABLE_ATTENTION = frozenset({"sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"})
#: the padding share of length-sorted rows from which packing pays for its block-diagonal attention mask
PACKING_MIN_PADDING = 0.1


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
    """The micro-batches of ``batch`` (see the module docstring); every row is in exactly one of them.

    With ``pack``, sequences are packed only where length-sorted rows would leave at least
    :data:`PACKING_MIN_PADDING` of the positions padding: below that, packing saves less than the packed attention
    mask costs (measured on the tiny benchmark, docs/benchmarks.md)."""
    lengths = [max(int(n), 1) for n in batch.attention_mask.sum(dim=1).tolist()]
    groups = _group(lengths, max_tokens, pack=False)
    if pack:
        padded = sum(len(g) * max(lengths[r[0]] for r in g) for g in groups)
        if 1.0 - sum(lengths) / padded >= PACKING_MIN_PADDING:
            groups = _group(lengths, max_tokens, pack=True)
    return [_build(batch, rows, lengths) for rows in groups]


def _group(lengths: list[int], max_tokens: int, pack: bool) -> list[list[list[int]]]:
    """Micro-batch -> model rows -> batch rows: longest first, first-fit (module docstring)."""
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    groups: list[list[list[int]]] = []
    width = 0
    for row in order:
        length = lengths[row]
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
    return groups


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
    return sum(lengths[r] for r in model_row)


def _build(batch: TokenBatch, model_rows: list[list[int]], lengths: list[int]) -> MicroBatch:
    # where each sequence goes: (model row, offset); then every index is computed at once (no per-row tensor work)
    rows, starts, sizes = [], [], []
    width = max(_used(r, lengths) for r in model_rows)
    for model_row, placed in enumerate(model_rows):
        offset = 0
        for row in placed:
            rows.append(row)
            starts.append(model_row * width + offset)
            sizes.append(lengths[row])
            offset += lengths[row]
    rows_t, starts_t, sizes_t = torch.tensor(rows), torch.tensor(starts), torch.tensor(sizes)
    seq = torch.repeat_interleave(torch.arange(len(rows)), sizes_t)  # [n] the placed sequence of each position
    pos = torch.arange(len(seq)) - torch.repeat_interleave(torch.cumsum(sizes_t, 0) - sizes_t, sizes_t)
    dest = starts_t[seq] + pos
    shape = (len(model_rows), width)
    source_row = torch.full(shape, -1, dtype=torch.long)
    source_pos = torch.full(shape, -1, dtype=torch.long)
    source_row.view(-1)[dest] = rows_t[seq]
    source_pos.view(-1)[dest] = pos
    real = source_row >= 0
    input_ids = torch.zeros(shape, dtype=batch.input_ids.dtype)
    input_ids[real] = batch.input_ids[source_row[real], source_pos[real]]
    # padding: a segment of its own after the row's sequences, positions restarting at 0, attended by no real token
    used = real.sum(dim=1, keepdim=True)
    position_ids = torch.where(real, source_pos, torch.arange(width).unsqueeze(0) - used)
    # response tokens: the predicting position of column t of a row is response_start - 1 + t
    index, columns = batch.response_mask[rows_t].nonzero(as_tuple=True)
    start = batch.response_start[rows_t[index]]
    packed = any(len(r) > 1 for r in model_rows)
    return MicroBatch(
        input_ids,
        None if packed else real.to(batch.attention_mask.dtype),
        position_ids,
        source_row,
        source_pos,
        starts_t[index] + start - 1 + columns,
        batch.input_ids[rows_t[index], start + columns],
        rows_t[index],
        columns,
    )
