"""The ``regex`` verifier: a format reward for responses that match a pattern."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

import rlzoo
from rlzoo.interfaces import Params, Sample, Verdict, Verifier


@rlzoo.register("verifier", "regex")
class RegexVerifier(Verifier):
    """Format reward: ``reward`` if the response matches a regular expression, else 0.

    ``fullmatch: true`` (default) requires the whole response to match (``re.fullmatch``); ``false`` accepts a
    match anywhere (``re.search``). The pattern uses Python ``re`` syntax; flags go inline, e.g. ``(?s)`` so
    ``.`` also matches newlines. The reference answer is not used.
    """

    class Params(Params):
        pattern: str = Field(description="Python regular expression")
        reward: float = Field(1.0, description="reward of a matching response")
        fullmatch: bool = Field(True, description="the whole response must match (else: a match anywhere)")

        @field_validator("pattern")
        @classmethod
        def _compiles(cls, value: str) -> str:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"invalid regular expression {value!r}: {err}") from None
            return value

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._regex = re.compile(self.params.pattern)
        self._match = self._regex.fullmatch if self.params.fullmatch else self._regex.search

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(reward=self.params.reward if self._match(response) else 0.0)
