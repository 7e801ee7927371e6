"""Shared helpers of the rlzoo-estimators tests (a plain module, imported by the test files)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import rlzoo_estimators.plugin
from rlzoo.registry import Registry


def make_registry() -> Registry:
    """A registry holding only this distribution's plugin (independent of whatever else is installed)."""
    registry = Registry()
    registry.add_plugin(rlzoo_estimators.plugin, name="estimators", distribution="rlzoo-estimators")
    return registry


REGISTRY = make_registry()


def create(kind: str, name: str, **params):
    return REGISTRY.create(kind, name, params)


def t(values, dtype=torch.float64) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to(dtype).clone()
    return torch.tensor(values, dtype=dtype)


def right_padded_mask(lengths: list[int], width: int, dtype=torch.float64) -> torch.Tensor:
    cols = torch.arange(width)
    return (cols.unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(dtype)


@st.composite
def batch_shapes(draw, max_batch: int = 4, max_tokens: int = 6, min_length: int = 0):
    """(lengths, width): per-row response lengths and a padded width >= every length."""
    batch = draw(st.integers(1, max_batch))
    width = draw(st.integers(max(min_length, 1), max_tokens))
    lengths = draw(st.lists(st.integers(min_length, width), min_size=batch, max_size=batch))
    return lengths, width


def floats(lo: float, hi: float):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def tensor_of(draw, shape: tuple[int, ...], elements) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.tensor(draw(st.lists(elements, min_size=n, max_size=n)), dtype=torch.float64).reshape(shape)
