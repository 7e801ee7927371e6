"""Entry point of the rlzoo-routing distribution: registers the router policies."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_router_policies() -> list[type]:
    from rlzoo_routing import NoReplay, ReplayOld, ReplayRollout

    return [NoReplay, ReplayOld, ReplayRollout]
