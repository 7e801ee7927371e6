"""Reward parts: a ``Verdict`` may carry named parts, and the ``weighted`` verifier returns one per verifier it
combines (its unweighted reward), named by the part's label; labels are validated at their field."""

from __future__ import annotations

import pytest

import rlzoo
from rlzoo.errors import ConfigError
from rlzoo.interfaces import Sample, Verdict, Verifier
from rlzoo.rl.scoring import score


def weighted(*parts, **params):
    return rlzoo.default_registry().create("verifier", "weighted", {"verifiers": list(parts), **params}, loc="verifier")


def test_a_verdict_has_no_parts_unless_given_and_a_verifier_declares_none_by_default():
    assert Verdict(1.0).parts is None and Verdict(0.0, parts={"format": 1.0}).parts == {"format": 1.0}
    assert Verifier().reward_parts() is None
    assert rlzoo.default_registry().create("verifier", "exact", {}).reward_parts() is None


def test_weighted_returns_each_parts_unweighted_reward_by_label():
    verifier = weighted({"name": "exact", "label": "correct"}, {"name": "regex", "pattern": "4.*", "weight": 0.5})
    assert verifier.reward_parts() == ("correct", "regex")
    verdicts = verifier.verify_batch([Sample("1+3=", "4")] * 3, ["4", "46", "x"])
    assert [v.reward for v in verdicts] == [1.5, 0.5, 0.0]
    assert [v.parts for v in verdicts] == [
        {"correct": 1.0, "regex": 1.0},
        {"correct": 0.0, "regex": 1.0},
        {"correct": 0.0, "regex": 0.0},
    ]
    assert verifier.verify(Sample("1+3=", "4"), "46").parts == {"correct": 0.0, "regex": 1.0}


def test_two_parts_of_one_verifier_are_told_apart_by_index():
    verifier = weighted({"name": "regex", "pattern": "a"}, {"name": "regex", "pattern": "b"}, {"name": "exact"})
    assert verifier.reward_parts() == ("regex_0", "regex_1", "exact")
    # an explicit label takes the name: the other part of that verifier keeps its indexed one
    verifier = weighted({"name": "regex", "pattern": "a", "label": "exact"}, {"name": "exact"})
    assert verifier.reward_parts() == ("exact", "exact_1")


@pytest.mark.parametrize(
    ("parts", "field", "message"),
    [
        (
            [{"name": "exact", "label": "x"}, {"name": "math", "label": "x"}],
            "verifier.verifiers.1.label",
            "two parts are labelled 'x': give each part its own label",
        ),
        ([{"name": "exact", "label": ""}], "verifier.verifiers.0.label", "a part's label is a non-empty name"),
        ([{"name": "exact", "label": "a/b"}], "verifier.verifiers.0.label", "without '/'"),
        ([{"name": "exact", "label": 3}], "verifier.verifiers.0.label", "a part's label is a non-empty name"),
    ],
)
def test_bad_labels_are_reported_at_their_field(parts, field, message):
    with pytest.raises(ConfigError) as info:
        weighted(*parts)
    found = dict(info.value.problems)
    assert field in found and message in found[field], found


def test_the_label_stays_in_the_resolved_parameters_only_when_given():
    assert weighted({"name": "exact", "label": "correct"}).params.verifiers[0]["label"] == "correct"
    assert "label" not in weighted({"name": "exact"}).params.verifiers[0]


def test_a_part_that_cannot_score_a_response_costs_it_every_part():
    class Fragile(Verifier):
        name = "fragile"

        def verify(self, sample, response):
            if response == "boom":
                raise RuntimeError("no")
            return Verdict(1.0)

    verifier = weighted({"name": "exact"})
    verifier.parts.append(Fragile())
    verifier.weights.append(1.0)
    verifier.labels.append("fragile")
    scores = score(verifier, [Sample("1+3=", "4")] * 2, ["4", "boom"])
    assert scores.errors == 1
    assert scores.verdicts[0].parts == {"exact": 1.0, "fragile": 1.0}
    assert scores.verdicts[1].reward == 0.0 and scores.verdicts[1].parts is None  # the batch gives it 0 per part
