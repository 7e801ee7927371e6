"""Memory sizes as people write them (``80GB``, ``80GiB``, ``80e9``) and as the console prints them."""

from __future__ import annotations

import math
import re
import sys

GB, GiB = 10**9, 2**30
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e\+?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``"80GB"`` (10^9), ``"80GiB"`` (2^30), ``"80e9"`` or ``"85899345920"`` as bytes; ``ValueError`` otherwise
    (a size beyond a float's range, ``1e400GB``, included)."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size: write e.g. 80GB, 80GiB or 80e9 (bytes)")
    size = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(size):  # 1e400GB: a float overflows to inf, which int() refuses with a traceback
        raise ValueError(
            f"{text!r} is too large a memory size (beyond {sys.float_info.max:.2g} bytes): write e.g. "
            "80GB, 80GiB or 80e9 (bytes)"
        )
    size = int(size)
    if size <= 0:
        raise ValueError(f"{text!r} is not a positive memory size")
    return size


def format_bytes(size: float) -> str:
    """Bytes in decimal units (GPU makers' ``80 GB``): ``12.3 GB``, or ``456 MB`` below a gigabyte."""
    return f"{size / GB:.1f} GB" if size >= GB else f"{size / 10**6:.0f} MB"
