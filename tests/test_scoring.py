"""A verifier that raises on some responses costs those responses their reward, never the run."""

from __future__ import annotations

from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.scoring import score, step_token_ends


class Fragile(Verifier):
    name = "fragile"

    def verify(self, sample: Sample, response: str) -> Verdict:
        if response == "boom":
            raise RuntimeError("cannot parse")
        return Verdict(1.0 if response == sample.answer else 0.0)


def test_a_crashing_verifier_gives_zero_and_is_counted():
    samples = [Sample("1+1=", "2")] * 4
    result = score(Fragile(), samples, ["2", "boom", "3", "boom"])
    assert [v.reward for v in result.verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert result.errors == 2
    assert "RuntimeError" in result.verdicts[1].reason


def test_no_errors_when_the_verifier_is_sound():
    result = score(Fragile(), [Sample("1+1=", "2")] * 2, ["2", "3"])
    assert result.errors == 0 and [v.reward for v in result.verdicts] == [1.0, 0.0]


def test_step_spans_map_to_token_ends():
    ends = [1, 2, 3, 4, 5, 6, 6]  # "8;6;10" one character per token, then <eos>, which decodes to nothing
    assert step_token_ends([(0, 1), (2, 3), (4, 6)], ends) == [1, 3, 6]
