"""No batch filter: every scored group is trained on, from one generation batch (the base's behaviour)."""

from __future__ import annotations

from rlzoo.interfaces import BatchFilter


class NoFilter(BatchFilter):
    """Keep every group (one generation batch per step)."""

    name = "none"
    formula = "keep every group"
