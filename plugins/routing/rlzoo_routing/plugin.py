"""The ``rlzoo`` entry point of rlzoo-routing. Its components register where they are defined
(``@rlzoo.register(kind, name)`` on each class): adding one is adding its module to the package."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_component_modules() -> list[str]:
    return ["rlzoo_routing"]
