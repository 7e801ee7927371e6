"""An environment's and its tools' faults during episodes: contained by the runner, counted, named once.

Whatever an environment does, the run goes on (docs/faults.md): an episode whose ``reset`` or ``step`` raised, or whose
``step`` answered with something other than an :class:`~rlzoo.interfaces.Observation` (:func:`observation_problem`),
ends there with reward 0, counted in ``episode/errors`` and in the environment's own key (:func:`error_key`,
``env/<name>/errors``, declared :class:`~rlzoo.util.reductions.FailedEpisodes` for the run's failure policy); a
cold-start demonstration it fails on is left out (:class:`EnvironmentFailure`). A tool's failures are already
observations the model reads (:mod:`rlzoo.tools`), counted in ``tool/<name>/errors|timeouts``.

:class:`FaultNotices` names on the console, once per component and process, the first failure of the environment
and the first batch of episodes in which every call of a tool failed, with the component's distribution as the
registry names it (``environment 'name' (distribution)``); later ones are only counted. Once per process, not per
runner: a run's cold start, its evaluations and its rollouts each build or share a runner of the same components,
and the user is told once (``rlzoo train`` is one run per process).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlzoo.component_errors import named
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Environment, Observation
from rlzoo.tools import ToolOutcome, failing_tools

log = logging.getLogger("rlzoo.episodes.faults")

#: what an environment's failure costs, by where it happened (``key``: its per-environment count)
EPISODE_ENDS = "that episode ends there with reward 0, counted in episode/errors and {key}"
DEMONSTRATION_LEFT_OUT = (
    "that demonstration is left out of the cold start, counted in cold_start.json's demonstration_errors"
)

_named: set[tuple[str, str]] = set()  # (kind, name) of the components already named on the console
_named_lock = threading.Lock()


class EnvironmentFailure(RlzooError):
    """The environment failed on a cold-start demonstration: it is left out (its message: why, in one line)."""


@dataclass(frozen=True)
class Raised:
    """What an environment did wrong in one call: ``where`` (``reset``, ``step``, ``render_turn``) and ``error``, the
    exception it raised or what was wrong with its answer (:func:`observation_problem`)."""

    where: str
    error: BaseException | str

    @property
    def text(self) -> str:
        if isinstance(self.error, BaseException):
            message = " ".join(str(self.error).split())  # one line, whatever the exception's text
            return f"raised {type(self.error).__name__}: {message} in {self.where}"
        return f"answered {self.where} with {self.error}"


def observation_problem(observation: Any) -> str | None:
    """What is wrong with what an environment's ``step`` answered, or ``None``: it must be an :class:`Observation`
    whose reward is a finite number, whose messages are mappings and whose tool outcomes are ``ToolOutcome``."""
    if not isinstance(observation, Observation):
        return f"a {type(observation).__name__}, not an Observation"
    try:
        reward = float(observation.reward)
    except (TypeError, ValueError):
        return f"a reward that is not a number ({observation.reward!r})"
    if not math.isfinite(reward):
        return f"a reward that is not finite ({reward!r})"
    messages, outcomes = observation.messages, observation.tool_outcomes
    if not isinstance(messages, Sequence) or not all(isinstance(m, Mapping) for m in messages):
        return "messages that are not a list of mappings (chat messages)"
    if not isinstance(outcomes, Sequence) or not all(isinstance(o, ToolOutcome) for o in outcomes):
        return "tool_outcomes that are not a list of ToolOutcome"
    return None


def error_key(environment: Environment) -> str:
    """The key counting ``environment``'s failed episodes: in its kind's namespace, where its reports would be."""
    return f"{environment.metric_namespace or environment.kind}/{environment.name}/errors"


class FaultNotices:
    """Names an episode's failing components on the console, once each (see the module docstring)."""

    def __init__(self, environment: Environment, distributions: Mapping[tuple[str, str], str] | None = None) -> None:
        self.environment = environment
        self.distributions = dict(distributions or {})  # (kind, name) -> the distribution it came from

    def named(self, kind: str, name: str) -> str:
        """``kind 'name' (distribution)``, as the registry names a component."""
        return named(kind, name, self.distributions.get((kind, name)))

    def environment_failed(self, raised: Raised, consequence: str) -> str:
        """Why the environment failed, in one line (the failed episode's verdict reason); the first time also on the
        console with what it costs (``consequence``), and its traceback in the log (INFO: the run's log file)."""
        env = self.environment
        reason = f"{self.named('environment', env.name)} {raised.text}"
        if _first_time("environment", env.name):
            costs = consequence.format(key=error_key(env))
            log.warning("%s: %s; further failures are counted, not shown", reason, costs)
            if isinstance(raised.error, BaseException):
                log.info("the traceback of that failure:", exc_info=raised.error)
        return reason

    def tools_failed(self, outcomes: Sequence[ToolOutcome]) -> None:
        """Name, once each, the environment's tools none of whose calls in ``outcomes`` (a batch of episodes')
        succeeded."""
        for name, calls in failing_tools(outcomes).items():
            if name not in self.environment.tools or not _first_time("tool", name):
                continue
            statuses = Counter(o.status for o in calls)
            log.warning(
                "%s: all %d of its calls in a batch of episodes failed (%d errors, %d timeouts; the first: %s); the "
                "model reads each failure as the call's result; counted in tool/%s/errors and tool/%s/timeouts, not "
                "shown again",
                self.named("tool", name),
                len(calls),
                statuses["error"],
                statuses["timeout"],
                _clip(calls[0].content),
                name,
                name,
            )


def _first_time(kind: str, name: str) -> bool:
    """Whether component ``name`` of ``kind`` was not named on the console yet in this process (and now is)."""
    with _named_lock:
        if (kind, name) in _named:
            return False
        _named.add((kind, name))
        return True


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
