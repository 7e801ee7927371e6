"""A test plugin (``--plugin``): the ``math`` verifier's verdicts, each with one reward part naming its prompt.

A step's metrics then hold ``reward/parts/prompt_<digest>_mean`` for every prompt it trained on, the share of the
step's responses sampled from that prompt (``count / rollout.prompts_per_step`` with whole groups), so the prompts a
run trained on can be counted from its ``metrics.jsonl`` alone (test_vllm_server_resume.py). The rewards are the
math verifier's own; the group advantage does not read the parts.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import rlzoo
from rlzoo.interfaces import Sample, Verdict
from rlzoo_verifiers.math import MathVerifier

PREFIX = "reward/parts/prompt_"


def prompt_part(sample: Sample) -> str:
    return "prompt_" + hashlib.sha1(sample.prompt.encode()).hexdigest()[:12]


@rlzoo.register("verifier", "prompt-ids")
class PromptIdsVerifier(MathVerifier):
    """The math verifier, plus the part ``prompt_<sha1 of the prompt>`` = 1 on every verdict."""

    def verify(self, sample: Sample, response: str) -> Verdict:
        return replace(super().verify(sample, response), parts={prompt_part(sample): 1.0})

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict]:
        verdicts = super().verify_batch(samples, responses)
        return [replace(v, parts={prompt_part(s): 1.0}) for s, v in zip(samples, verdicts, strict=True)]
