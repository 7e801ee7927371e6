"""One decode path: training and evaluation score the same strings, also with a byte-level BPE tokenizer."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlzoo.config.schema import RunConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings
from rlzoo.interfaces import AdvantageSource, Sample, Verdict, Verifier
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, evaluate
from rlzoo.rl.rollouts import collect
from rlzoo.util.decode import response_text, token_char_ends
from rlzoo.util.timer import Timer

TEXT = "naïve café — 日本語 🙂 ok"


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE built here from a tiny corpus: multi-byte characters end up split over several tokens."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["plain ascii words only, numbers 12 34"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def test_the_test_text_decodes_differently_token_by_token(bpe):
    ids = bpe(TEXT, add_special_tokens=False)["input_ids"]
    per_token = "".join(bpe.decode([t]) for t in ids)
    assert per_token != TEXT  # split characters decode to replacement characters one token at a time
    assert response_text(bpe, ids + [bpe.eos_token_id]) == TEXT


def test_token_char_ends_follow_the_whole_text(bpe):
    ids = bpe(TEXT, add_special_tokens=False)["input_ids"] + [bpe.eos_token_id]
    ends = token_char_ends(bpe, ids)
    assert len(ends) == len(ids)
    assert ends == sorted(ends) and ends[-1] == len(TEXT)
    # each character's end is reached by exactly the token that completes it
    for t, end in enumerate(ends):
        assert TEXT.startswith(response_text(bpe, ids[: t + 1]).rstrip("\ufffd")[:end])
    assert len(set(ends)) < len(ends)  # some tokens are only parts of a character


class FixedRollout(RolloutEngine):
    """Returns the same response token ids for every prompt (the decode path is what is under test)."""

    name = "fixed"

    def __init__(self, response_ids: list[int]) -> None:
        super().__init__()
        self.response_ids = response_ids

    def generate(self, prompts, sampling: SamplingSettings):
        return [
            [Generation(p, list(self.response_ids), [0.0] * len(self.response_ids), True) for _ in range(sampling.n)]
            for p in prompts
        ]


class Recording(Verifier):
    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def verify(self, sample: Sample, response: str) -> Verdict:
        self.seen.append(response)
        return Verdict(float(response == sample.answer))


class Zero(AdvantageSource):
    name = "zero"

    def compute(self, batch):
        return torch.zeros_like(batch.mask)


def test_training_and_evaluation_score_identical_strings(bpe):
    ids = bpe(TEXT, add_special_tokens=False)["input_ids"] + [bpe.eos_token_id]
    config = RunConfig.model_validate(
        {"task": {"name": "arithmetic"}, "rollout": {"group_size": 2, "max_new_tokens": len(ids)}}
    )
    verifier, rollout = Recording(), FixedRollout(ids)
    samples = [Sample("q: ", TEXT)]
    parts = Components(
        objective=None,
        advantage=Zero(),
        verifier=verifier,
        correction=None,
        rollout=rollout,
        learner=Learner(None),
        tokenizer=bpe,
    )  # type: ignore[arg-type]
    collected = collect(0, samples, parts.rollout_parts(config), Timer())
    scored_in_training = list(verifier.seen)
    verifier.seen.clear()
    result = evaluate(samples, rollout, verifier, bpe, config)
    assert scored_in_training == [TEXT] * 2
    assert verifier.seen == [TEXT] * len(verifier.seen) and verifier.seen
    assert collected.rewards.rewards.tolist() == [1.0, 1.0] and result["eval/accuracy"] == 1.0
