"""rlzoo: reinforcement-learning post-training of language models, as a zoo of small swappable components.

Public API (what plugins and users may import):

- ``rlzoo.hookimpl`` / ``rlzoo.hookspecs``: the plugin hooks; ``rlzoo.register(kind, name)``: mark a component
  class of a plugin module (a local file in ``plugins:`` / ``--plugin``) instead of writing its hook.
- ``rlzoo.interfaces``: the component base classes (ratio, advantage, clipper, aggregation, kl, router,
  verifier, task, tool, tool parser, environment).
- ``rlzoo.tools.run_tool_calls``: run one turn's tool calls (for environments that call tools).
- ``rlzoo.build_objective``: compose an algorithm's loss for use in any training loop.
- ``rlzoo.load_config`` / ``rlzoo.default_registry``.
"""

from __future__ import annotations

from typing import Any

from rlzoo.hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "build_objective": ("rlzoo.rl.objective", "build_objective"),
    "Objective": ("rlzoo.rl.objective", "Objective"),
    "load_config": ("rlzoo.config.resolution", "load_config"),
    "RunConfig": ("rlzoo.config.schema", "RunConfig"),
    "default_registry": ("rlzoo.registry", "default_registry"),
    "Registry": ("rlzoo.registry", "Registry"),
    "register": ("rlzoo.registry", "register"),
}


def __getattr__(name: str) -> Any:
    # torch-heavy modules load on first use so `import rlzoo` stays cheap for plugin discovery
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'rlzoo' has no attribute {name!r}")


__all__ = ["hookimpl", "__version__", *_LAZY]
