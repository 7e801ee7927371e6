"""No batch filter: every scored group is trained on, from one generation batch (the base's behaviour)."""

from __future__ import annotations

import rlzoo
from rlzoo.interfaces import BatchFilter


@rlzoo.register("batch_filter", "none")
class NoFilter(BatchFilter):
    """Keep every group (one generation batch per step)."""

    formula = "keep every group"
