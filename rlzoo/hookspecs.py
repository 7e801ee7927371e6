"""Plugin hook specifications.

A plugin is a module (or object) registered under the ``rlzoo`` entry-point group. It implements any of the
hooks below with ``@rlzoo.hookimpl``; each returns the component *classes* it contributes. Built-in components
are found exactly the same way: the core ships none of the algorithm components itself.

The contract every hook shares, stated here once (the docs link to this module):

- **Who calls it, when:** :meth:`rlzoo.registry.Registry.discover`, once per process, the first time a command
  or :func:`rlzoo.registry.default_registry` needs the registry (``rlzoo plugins list``, ``config check``,
  ``train``, a test). It imports each entry point, registers it with pluggy and calls every hook it implements.
- **With what:** no arguments.
- **What it returns:** a list of component classes (not instances) of the hook's kind: each a subclass of the
  interface named in the hook's docstring, with ``kind`` equal to that kind and a ``name`` unique within it
  (two distributions claiming one ``(kind, name)`` is an error naming both). A plugin that fails to import, a hook
  that raises, or a returned object that breaks this contract is reported by name and skipped; the other
  plugins load normally.
- **What happens next:** a config spec ``{name: X, ...}`` of that kind instantiates ``X(X.Params(**rest))``;
  the loop calls the instance through its interface (see each interface's docstring in
  :mod:`rlzoo.interfaces` / :mod:`rlzoo.engines`).

Example ``pyproject.toml`` of a plugin distribution::

    [project.entry-points.rlzoo]
    my_plugin = "my_package.plugin"

and ``my_package/plugin.py``::

    import rlzoo

    @rlzoo.hookimpl
    def rlzoo_clippers():
        return [MyClipper]

Or the class registers where it is defined, ``@rlzoo.register("clipper", "my-clip")`` above ``class MyClipper``, and
the entry point names the package (``my_plugin = "my_package"``) or ``plugin.py`` names it through
:func:`rlzoo_component_modules`: every marked class in the package's modules is found, with the same checks.
"""

from __future__ import annotations

import pluggy

PROJECT = "rlzoo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rlzoo_ratio_estimators() -> list[type]:
    """Return :class:`rlzoo.interfaces.RatioEstimator` subclasses."""


@hookspec
def rlzoo_advantage_sources() -> list[type]:
    """Return :class:`rlzoo.interfaces.AdvantageSource` subclasses."""


@hookspec
def rlzoo_clippers() -> list[type]:
    """Return :class:`rlzoo.interfaces.Clipper` subclasses."""


@hookspec
def rlzoo_aggregations() -> list[type]:
    """Return :class:`rlzoo.interfaces.LossAggregation` subclasses."""


@hookspec
def rlzoo_kl_estimators() -> list[type]:
    """Return :class:`rlzoo.interfaces.KLEstimator` subclasses."""


@hookspec
def rlzoo_kl_controllers() -> list[type]:
    """Return :class:`rlzoo.interfaces.KLController` subclasses (the coefficient of the KL in the reward)."""


@hookspec
def rlzoo_value_losses() -> list[type]:
    """Return :class:`rlzoo.interfaces.ValueLoss` subclasses (the critic's regression loss)."""


@hookspec
def rlzoo_corrections() -> list[type]:
    """Return :class:`rlzoo.interfaces.MismatchCorrection` subclasses (train-inference mismatch)."""


@hookspec
def rlzoo_batch_filters() -> list[type]:
    """Return :class:`rlzoo.interfaces.BatchFilter` subclasses (which scored prompt groups a step trains on)."""


@hookspec
def rlzoo_reward_shapers() -> list[type]:
    """Return :class:`rlzoo.interfaces.RewardShaper` subclasses (terms added to the verifier's rewards)."""


@hookspec
def rlzoo_regularisers() -> list[type]:
    """Return :class:`rlzoo.interfaces.Regulariser` subclasses (extra loss terms, e.g. an entropy bonus)."""


@hookspec
def rlzoo_router_policies() -> list[type]:
    """Return :class:`rlzoo.interfaces.RouterPolicy` subclasses."""


@hookspec
def rlzoo_verifiers() -> list[type]:
    """Return :class:`rlzoo.interfaces.Verifier` subclasses."""


@hookspec
def rlzoo_tasks() -> list[type]:
    """Return :class:`rlzoo.interfaces.Task` subclasses."""


@hookspec
def rlzoo_tools() -> list[type]:
    """Return :class:`rlzoo.interfaces.Tool` subclasses (functions a multi-turn episode's model may call)."""


@hookspec
def rlzoo_tool_parsers() -> list[type]:
    """Return :class:`rlzoo.interfaces.ToolCallParser` subclasses (find tool calls in the model's text)."""


@hookspec
def rlzoo_environments() -> list[type]:
    """Return :class:`rlzoo.interfaces.Environment` subclasses (what answers the policy between turns)."""


@hookspec
def rlzoo_rollout_engines() -> list[type]:
    """Return :class:`rlzoo.engines.RolloutEngine` subclasses."""


@hookspec
def rlzoo_training_engines() -> list[type]:
    """Return :class:`rlzoo.engines.TrainingEngine` subclasses."""


@hookspec
def rlzoo_loggers() -> list[type]:
    """Return :class:`rlzoo.interfaces.Logger` subclasses (experiment trackers a run mirrors its records to)."""


@hookspec
def rlzoo_component_modules() -> list[str]:
    """Return the names of modules or packages whose classes marked with ``@rlzoo.register(kind, name)`` this
    plugin contributes: a package stands for every module in it (recursively), but those whose name starts with
    ``_``. So a component registers where it is defined: adding one is adding its module. Each module is imported
    on its own; one that fails to import is reported by its name, and the others still contribute. (An entry point
    that names a package itself, ``my_plugin = "my_package"``, contributes that package's marked classes alike.)"""


# hook name -> component kind it contributes
HOOK_KINDS: dict[str, str] = {
    "rlzoo_ratio_estimators": "ratio",
    "rlzoo_advantage_sources": "advantage",
    "rlzoo_clippers": "clipper",
    "rlzoo_aggregations": "aggregation",
    "rlzoo_kl_estimators": "kl",
    "rlzoo_kl_controllers": "kl_controller",
    "rlzoo_value_losses": "value_loss",
    "rlzoo_corrections": "correction",
    "rlzoo_batch_filters": "batch_filter",
    "rlzoo_reward_shapers": "reward_shaper",
    "rlzoo_regularisers": "regulariser",
    "rlzoo_router_policies": "router",
    "rlzoo_verifiers": "verifier",
    "rlzoo_tasks": "task",
    "rlzoo_tools": "tool",
    "rlzoo_tool_parsers": "tool_parser",
    "rlzoo_environments": "environment",
    "rlzoo_rollout_engines": "rollout_engine",
    "rlzoo_training_engines": "training_engine",
    "rlzoo_loggers": "logger",
}
