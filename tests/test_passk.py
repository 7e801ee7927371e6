"""Pass@k against hand-computed values (Chen et al. 2021, eq. 1)."""

import pytest

from rlzoo.util.passk import mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one right in four: a single draw finds it 1/4 of the time
    # 2 of 4 right, k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    # 1 of 8 right, k=4: 1 - C(7,4)/C(8,4) = 1 - 35/70 = 0.5
    assert pass_at_k(8, 1, 4) == pytest.approx(0.5)
    assert pass_at_k(8, 5, 4) == 1.0  # n - c = 3 < k: every 4-subset holds a right one


def test_pass_at_1_is_the_share_correct():
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_mean_over_prompts():
    out = mean_pass_at_k([4, 4], [1, 2], [1, 2])
    assert out["eval/pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert out["eval/pass@2"] == pytest.approx(((1 - 3 / 6) + 5 / 6) / 2)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 1), (4, 1, 0)])
def test_out_of_range(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_config_k_above_samples_names_the_field():
    from rlzoo.config.resolution import build_config
    from rlzoo.errors import ConfigError

    with pytest.raises(ConfigError, match="train.eval_pass_at_k"):
        build_config({}, ["train.eval_pass_at_k=[1, 4]", "train.eval_samples_per_prompt=2"])
    config = build_config({}, ["train.eval_pass_at_k=[1, 4]", "train.eval_samples_per_prompt=4"])
    assert config.train.eval_pass_at_k == [1, 4]


def test_evaluate_logs_pass_at_k_per_prompt():
    """loop.evaluate counts each prompt's correct responses: prompts with 1 and 3 of 4 right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlzoo.config.schema import RunConfig
    from rlzoo.engines import Generation, RolloutEngine
    from rlzoo.interfaces import Sample, Verdict, Verifier
    from rlzoo.rl.loop import evaluate

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["yes no 12"] * 5, trainer)
    bpe = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    right, wrong = (bpe(t, add_special_tokens=False)["input_ids"] + [bpe.eos_token_id] for t in ("yes", "no"))
    correct = [1, 3]

    class Scripted(RolloutEngine):
        name = "scripted"

        def generate(self, prompts, sampling):
            return [
                [Generation(p, right if j < correct[i] else wrong, [0.0], True) for j in range(sampling.n)]
                for i, p in enumerate(prompts)
            ]

    class Exact(Verifier):
        name = "exact"

        def verify(self, sample, response):
            return Verdict(float(response == sample.answer))

    config = RunConfig.model_validate(
        {
            "task": {"name": "arithmetic"},
            "train": {"eval_samples_per_prompt": 4, "eval_temperature": 1.0, "eval_pass_at_k": [1, 2, 4]},
        }
    )
    out = evaluate([Sample("a", "yes"), Sample("b", "yes")], Scripted(), Exact(), bpe, config)
    assert out["eval/accuracy"] == pytest.approx(0.5)
    assert out["eval/pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert out["eval/pass@2"] == pytest.approx(((1 - 3 / 6) + 1.0) / 2)  # C(3,2)/C(4,2) = 3/6; n - c = 1 < 2
    assert out["eval/pass@4"] == pytest.approx(1.0)
