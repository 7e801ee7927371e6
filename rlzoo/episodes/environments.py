"""The core's own environment, registered where it is defined (``register``) and found through the ``rlzoo``
entry-point group, as every plugin's is (this module is the entry point)."""

from __future__ import annotations

from typing import Any

from rlzoo.interfaces import Environment, Observation, Sample
from rlzoo.registry import register


@register("environment", "single-turn")
class SingleTurn(Environment):
    """One turn per episode: the response is the episode (rlzoo's single-turn rollouts; the default)."""

    multi_turn = False

    def step(self, state: Any, sample: Sample, text: str) -> Observation:
        return Observation(done=True)
