"""The core's own environment, registered through the ``rlzoo`` entry-point group as every plugin's is."""

from __future__ import annotations

from typing import Any

from rlzoo.hookspecs import hookimpl
from rlzoo.interfaces import Environment, Observation, Sample


class SingleTurn(Environment):
    """One turn per episode: the response is the episode (rlzoo's single-turn rollouts; the default)."""

    name = "single-turn"
    multi_turn = False

    def step(self, state: Any, sample: Sample, text: str) -> Observation:
        return Observation(done=True)


@hookimpl
def rlzoo_environments() -> list[type]:
    return [SingleTurn]
