"""A safetensors file checked from its header alone, no tensor loaded: what ``safe_open`` refuses, said in one line.

The format (https://github.com/huggingface/safetensors, "Format"): 8 bytes, a little-endian ``u64`` ``N``; ``N`` bytes
of a JSON object mapping each tensor's name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (and an optional
``"__metadata__"`` of strings); then the tensors' bytes. The offsets are relative to the end of the header and, sorted,
cover the data exactly: each tensor starts where the one before it ends, holds ``prod(shape) * bits(dtype) / 8``
bytes, and the last one ends at the end of the file. :func:`read_header` checks all of this (the rules of the
library's own ``Metadata::validate``) by reading ``8 + N`` bytes, so a model folder's weights or a checkpoint's files
are checked at the cost of their headers: a truncated file, a damaged header and a file longer than its header says
are each told apart. Changed tensor bytes are not visible here (a digest tells those).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

#: safetensors refuses a header longer than this (``MAX_HEADER_SIZE``)
MAX_HEADER_BYTES = 100_000_000

#: bits per element of the dtypes safetensors 0.8 knows; a dtype not listed here has its byte count unchecked
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it."""

    dtype: str
    shape: tuple[int, ...]


class HeaderProblem(ValueError):
    """Why a file is not a whole safetensors file (the message reads after the file's name: ``truncated (...)``)."""


def read_header(path: Path | str) -> dict[str, TensorInfo]:
    """Every tensor of the safetensors file ``path`` by name, from its header; raises :class:`HeaderProblem` for a
    file that is truncated, longer than its header says, or whose header is damaged, and ``OSError`` for one that
    cannot be read."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise HeaderProblem(f"truncated ({size} bytes, not even a header)")
        length = struct.unpack("<Q", head)[0]
        if length > size - 8 or length > MAX_HEADER_BYTES:
            raise HeaderProblem(f"truncated or damaged header ({size} bytes, header of {length} bytes)")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise HeaderProblem("damaged header (not valid safetensors: the header is no JSON object)")
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensor, span = _entry(name, entry)
        tensors[name] = tensor
        spans.append((span, name, tensor))
    end = 0
    for (begin, stop), name, tensor in sorted(spans, key=lambda item: item[0]):
        if begin != end:
            raise HeaderProblem(
                f"damaged header (tensor {name!r} starts at data byte {begin}, the one before it ends at {end})"
            )
        bits = DTYPE_BITS.get(tensor.dtype)
        if bits is not None and math.prod(tensor.shape) * bits != (stop - begin) * 8:
            raise HeaderProblem(
                f"damaged header (tensor {name!r}, {tensor.dtype} of shape {list(tensor.shape)}, "
                f"is given {stop - begin} bytes)"
            )
        end = stop
    expected = 8 + length + end
    if size < expected:
        raise HeaderProblem(f"truncated ({size} of {expected} bytes)")
    if size > expected:
        raise HeaderProblem(f"longer than its header says ({size} bytes, {expected} expected)")
    return tensors


def header_problem(path: Path | str) -> str | None:
    """Why ``path`` is no whole safetensors file (``None``: it is), ``OSError`` included as ``unreadable (...)``."""
    try:
        read_header(path)
    except HeaderProblem as problem:
        return str(problem)
    except OSError as err:
        return f"unreadable ({' '.join(f'{type(err).__name__}: {err}'.split())})"
    return None


def _entry(name: str, entry: object) -> tuple[TensorInfo, tuple[int, int]]:
    """A header entry as ``(TensorInfo, (begin, end))``, or :class:`HeaderProblem` naming the tensor."""
    if isinstance(entry, dict):
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            isinstance(dtype, str)
            and isinstance(shape, list)
            and _naturals(shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and _naturals(offsets)
            and offsets[0] <= offsets[1]
        ):
            return TensorInfo(dtype, tuple(shape)), (offsets[0], offsets[1])
    raise HeaderProblem(f"damaged header (tensor {name!r} has no valid dtype, shape and data_offsets)")


def _naturals(values: list) -> bool:
    # bool is an int to Python, not to the format
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
