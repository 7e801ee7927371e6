"""The ``exact`` verifier: string equality with the reference answer."""

from __future__ import annotations

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Sample, Verdict, Verifier


@rlzoo.register("verifier", "exact")
class ExactVerifier(Verifier):
    """Reward 1 if the response equals the reference answer (surrounding whitespace ignored by default).

    ``reward = 1.0 if response.strip() == answer.strip() else 0.0``; with ``strip: false`` the strings must be
    identical, whitespace included.
    """

    class Params(Params):
        strip: bool = Field(True, description="ignore leading/trailing whitespace on both sides")

    def verify(self, sample: Sample, response: str) -> Verdict:
        answer = sample.answer
        if self.params.strip:
            response, answer = response.strip(), answer.strip()
        return Verdict(reward=1.0 if response == answer else 0.0)
