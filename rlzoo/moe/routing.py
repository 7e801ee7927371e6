"""The routing record: which experts every (row, position, MoE layer) of a batch used, stored compactly.

:class:`Routing` holds ``[B, S, L, k]`` top-k expert indices (``L`` = MoE layers in layer order) as ``uint8`` when
the model has at most 256 experts, else ``int16`` (:func:`index_dtype`), plus an optional ``valid [B, S]`` mask:
positions marked invalid carry no record and are routed afresh by the current router during replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def index_dtype(num_experts: int) -> torch.dtype:
    """The compact dtype that stores expert indices ``0..num_experts-1``."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 32768:
        return torch.int16
    return torch.int32


class Routing:
    """Top-k expert indices ``[B, S, L, k]`` of a batch, plus which ``[B, S]`` positions carry a record.

    ``layers`` are the decoder-layer indices of the ``L`` MoE layers. ``valid`` is ``None`` when every position
    has a record; otherwise replay routes the invalid positions afresh. Row selection (``routing[rows]`` or
    :meth:`select`) gives a minibatch's slice, aligned with ``rlzoo.engines.tokens.select_rows``.
    """

    def __init__(
        self,
        indices: torch.Tensor,
        layers: Sequence[int],
        num_experts: int,
        valid: torch.Tensor | None = None,
    ) -> None:
        if indices.dim() != 4:
            raise ValueError(f"routing indices must be [B, S, layers, top_k], got {tuple(indices.shape)}")
        if indices.shape[2] != len(layers):
            raise ValueError(f"indices have {indices.shape[2]} layers but {len(layers)} layer ids were given")
        if valid is not None:
            valid = valid.to(torch.bool)
            if tuple(valid.shape) != tuple(indices.shape[:2]):
                raise ValueError(f"valid {tuple(valid.shape)} does not match indices {tuple(indices.shape[:2])}")
            if bool(valid.all()):
                valid = None
        self.indices = indices.to(index_dtype(num_experts))
        self.layers = tuple(int(x) for x in layers)
        self.num_experts = int(num_experts)
        self.valid = valid

    @classmethod
    def empty(cls, layers: Sequence[int], num_experts: int, top_k: int) -> Routing:
        return cls(torch.zeros((0, 0, len(layers), top_k), dtype=index_dtype(num_experts)), layers, num_experts)

    # shape ---------------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.indices.shape)  # type: ignore[return-value]

    @property
    def batch_size(self) -> int:
        return self.indices.shape[0]

    @property
    def seq_len(self) -> int:
        return self.indices.shape[1]

    @property
    def top_k(self) -> int:
        return self.indices.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes held by the indices and the valid mask."""
        size = self.indices.numel() * self.indices.element_size()
        if self.valid is not None:
            size += self.valid.numel() * self.valid.element_size()
        return size

    def valid_mask(self) -> torch.Tensor:
        """``[B, S]`` bool: positions that carry a record."""
        if self.valid is None:
            return torch.ones(self.indices.shape[:2], dtype=torch.bool, device=self.indices.device)
        return self.valid

    # selection -----------------------------------------------------------------------------------------------
    def select(self, rows: torch.Tensor | slice | Sequence[int] | int) -> Routing:
        """The routing of a subset of rows (a minibatch), in the given order."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        elif not isinstance(rows, slice | torch.Tensor):
            rows = torch.as_tensor(list(rows), dtype=torch.long)
        if isinstance(rows, torch.Tensor):
            rows = rows.to(self.indices.device)
        valid = None if self.valid is None else self.valid[rows]
        return Routing(self.indices[rows], self.layers, self.num_experts, valid)

    __getitem__ = select

    def only_layers(self, layers: Sequence[int]) -> Routing:
        """The routing of a subset of the MoE layers (decoder-layer indices); replaying it leaves the others free."""
        missing = [layer for layer in layers if layer not in self.layers]
        if missing:
            raise ValueError(f"layers {missing} are not in this routing (layers {self.layers})")
        columns = [self.layers.index(layer) for layer in layers]
        return Routing(self.indices[:, :, columns], layers, self.num_experts, self.valid)

    def to(self, device: torch.device | str) -> Routing:
        valid = None if self.valid is None else self.valid.to(device)
        return Routing(self.indices.to(device), self.layers, self.num_experts, valid)

    def with_seq_len(self, seq_len: int) -> Routing:
        """Cut or right-pad (with invalid positions) to ``seq_len`` columns."""
        width = self.seq_len
        if seq_len == width:
            return self
        if seq_len < width:
            valid = None if self.valid is None else self.valid[:, :seq_len]
            return Routing(self.indices[:, :seq_len], self.layers, self.num_experts, valid)
        pad = seq_len - width
        b, _, L, k = self.indices.shape
        indices = torch.cat([self.indices, self.indices.new_zeros((b, pad, L, k))], dim=1)
        valid = torch.cat([self.valid_mask(), self.indices.new_zeros((b, pad), dtype=torch.bool)], dim=1)
        return Routing(indices, self.layers, self.num_experts, valid)

    @classmethod
    def cat(cls, parts: Sequence[Routing]) -> Routing:
        """Concatenate rows; narrower parts are right-padded with invalid positions."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        if any(p.layers != first.layers or p.num_experts != first.num_experts or p.top_k != first.top_k for p in parts):
            raise ValueError("routings of different models cannot be concatenated")
        width = max(p.seq_len for p in parts)
        padded = [p.with_seq_len(width) for p in parts]
        indices = torch.cat([p.indices for p in padded], dim=0)
        if all(p.valid is None for p in padded):
            return cls(indices, first.layers, first.num_experts)
        return cls(indices, first.layers, first.num_experts, torch.cat([p.valid_mask() for p in padded], dim=0))

    def gather(self, rows: torch.Tensor, positions: torch.Tensor) -> Routing:
        """The routing of a forward whose ``[b, w]`` positions hold ``(rows, positions)`` of this routing's batch
        (-1: padding, and positions past this routing's width: routed afresh) — a packed or reordered micro-batch."""
        ok = (rows >= 0) & (positions >= 0) & (positions < self.seq_len)
        r, p = rows.clamp(min=0), positions.clamp(min=0, max=max(self.seq_len - 1, 0))
        valid = ok & self.valid_mask()[r, p]
        return Routing(self.indices[r, p], self.layers, self.num_experts, valid)

    @classmethod
    def scatter(
        cls, parts: Sequence[tuple[Routing, torch.Tensor, torch.Tensor]], batch_size: int, seq_len: int
    ) -> Routing:
        """The inverse of :meth:`gather`: ``(routing of a forward, its rows, its positions)`` parts written into a
        ``[batch_size, seq_len]`` routing; positions no part covers are invalid. A later part overwrites."""
        first = parts[0][0]
        indices = first.indices.new_zeros((batch_size, seq_len, len(first.layers), first.top_k))
        valid = torch.zeros((batch_size, seq_len), dtype=torch.bool, device=first.indices.device)
        for part, rows, positions in parts:
            ok = (rows >= 0) & part.valid_mask()
            indices[rows[ok], positions[ok]] = part.indices[ok]
            valid[rows[ok], positions[ok]] = True
        return cls(indices, first.layers, first.num_experts, valid)

    def _assign(self, other: Routing) -> None:
        self.indices, self.layers, self.num_experts, self.valid = (
            other.indices,
            other.layers,
            other.num_experts,
            other.valid,
        )

    def __repr__(self) -> str:
        covered = "all" if self.valid is None else f"{int(self.valid.sum())}/{self.valid.numel()}"
        return (
            f"Routing(shape={self.shape}, layers={self.layers}, num_experts={self.num_experts}, "
            f"dtype={self.indices.dtype}, valid={covered}, nbytes={self.nbytes})"
        )
