"""The entry point (``[project.entry-points.rlzoo] thirdparty-engines``): registers both engines.

The engine modules are imported inside the hooks, as rlzoo's own engine plugin does, so discovery stays cheap.
"""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_rollout_engines() -> list[type]:
    from rlzoo_thirdparty_engines.rollout import RelayRolloutEngine

    return [RelayRolloutEngine]


@rlzoo.hookimpl
def rlzoo_training_engines() -> list[type]:
    from rlzoo_thirdparty_engines.trainer import RelayTrainingEngine

    return [RelayTrainingEngine]
