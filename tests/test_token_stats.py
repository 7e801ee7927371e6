"""Token statistics through one channel: a third party adds a statistic and an advantage source that reads it, in a
plugin file, without touching ``rlzoo/``; the training engine computes it through the registry, the step's old pass
asks for exactly what the source declares, and the source reads it in ``RewardBatch.token_stats``."""

from __future__ import annotations

import pytest
import torch
from test_micro_batches import _batch, _engine

from rlzoo.config.resolution import build_config
from rlzoo.engines.tokens import response_positions
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import MismatchCorrection, RewardBatch
from rlzoo.interfaces.token_stats import register_token_statistic, token_statistic, token_statistic_names
from rlzoo.local_plugins import load_plugins
from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry
from rlzoo.rl.advantages import advantages
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, old_pass
from rlzoo.rl.rollouts import RolloutBatch
from rlzoo.rl.step_record import StepRecord

PLUGIN = '''\
"""A statistic and the advantage source that reads it, as a third party writes them."""
import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, register_token_statistic


def top_prob(hidden, head, targets, chunk_tokens):
    """max_v pi(v) at each position, the head run chunk_tokens positions at a time."""
    parts = [torch.softmax(head(hidden[i : i + chunk_tokens]).double(), dim=-1).amax(dim=-1)
             for i in range(0, hidden.shape[0], chunk_tokens)]
    return torch.cat(parts) if parts else hidden.new_zeros(0)


register_token_statistic("top_prob", top_prob)


@rlzoo.register("advantage", "top-prob-test")
class TopProbAdvantage(AdvantageSource):
    """A = reward - max_v pi_old(v), per token: reads the statistic by name."""

    needs_token_stats = frozenset({"top_prob"})
    seen = None

    def compute(self, batch):
        batch.require_token_stats(self.name, "top_prob")
        type(self).seen = batch
        return (batch.rewards.unsqueeze(1) - batch.token_stats["top_prob"]) * batch.mask


@rlzoo.register("advantage", "unknown-stat-test")
class UnknownStatAdvantage(TopProbAdvantage):
    needs_token_stats = frozenset({"no_such_statistic"})
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("third_party")
    (folder / "top_prob_plugin.py").write_text(PLUGIN)
    registry = Registry.discover()  # the installed components, and the plugin's beside them
    load_plugins([str(folder / "top_prob_plugin.py")], registry, "--plugin", folder)
    return registry


class KeepAll(MismatchCorrection):
    name = "keep-all"

    def weights(self, old_train, old_rollout, mask):
        return torch.ones_like(mask)


def _expected_top_prob(engine, batch):
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    top = torch.softmax(logits.double(), dim=-1).amax(dim=-1)  # [B, L]
    return torch.gather(top, 1, response_positions(batch)) * batch.response_mask


def test_a_plugins_statistic_is_computed_by_the_engine_through_the_registry(plugin, tmp_path):
    assert "top_prob" in token_statistic_names() and "sum_pi_squared" in token_statistic_names()
    engine = _engine(tmp_path, moe=False, max_tokens_per_micro_batch=24, logits_chunk_tokens=5)
    batch = _batch(6)
    stats = engine.token_stats(batch, ["top_prob"])
    assert list(stats) == ["top_prob"] and stats["top_prob"].shape == batch.response_mask.shape
    assert (stats["top_prob"] - _expected_top_prob(engine, batch)).abs().max() < 1e-10


def test_the_step_hands_the_declared_statistics_to_a_third_party_source(plugin, tmp_path):
    source = plugin.create("advantage", "top-prob-test")
    engine = _engine(tmp_path, moe=False)
    batch = _batch(4)
    mask = batch.response_mask
    rewards = RewardBatch(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), mask)
    c = Components(
        objective=None,
        advantage=source,
        verifier=None,
        correction=KeepAll(),
        rollout=None,
        learner=Learner(engine),
        tokenizer=None,
    )
    record = StepRecord(0, rollout=RolloutBatch([], batch, torch.zeros_like(mask), rewards, {}))
    old_pass(record, c, "train")
    assert list(record.token_stats) == ["top_prob"]  # what the source declares, no more
    advantages(record, source, None)
    seen = type(source).seen
    assert list(seen.token_stats) == ["top_prob"] and seen.old_logprobs is record.old.logp
    expected = (rewards.rewards.unsqueeze(1) - _expected_top_prob(engine, batch)) * mask
    assert (record.advantages - expected).abs().max() < 1e-10


def test_a_source_given_no_statistic_and_a_clash_are_refused_by_name(plugin):
    source = plugin.create("advantage", "top-prob-test")
    bare = RewardBatch(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"needs RewardBatch.token_stats\['top_prob'\]"):
        source.compute(bare)
    with pytest.raises(RlzooError, match="'top_prob' is registered already"):
        register_token_statistic("top_prob", lambda hidden, head, targets, chunk: hidden[:, 0])
    with pytest.raises(RlzooError, match="no provider of the token statistic 'nope'"):
        token_statistic("nope")


def test_the_start_up_check_accepts_a_registered_statistic_and_refuses_an_unknown_one(plugin, tmp_path):
    def check(advantage: str) -> None:
        data = {
            "output_dir": str(tmp_path / advantage),
            "algorithm": {"advantage": {"name": advantage}, "router": None},
        }
        preflight(build_config(data, registry=plugin), plugin)

    check("top-prob-test")  # its statistic has a provider: no problem
    with pytest.raises(ConfigError) as err:
        check("unknown-stat-test")
    assert dict(err.value.problems) == {
        "algorithm.advantage": (
            "advantage 'unknown-stat-test' (algorithm.advantage) reads the token statistic 'no_such_statistic', which no "
            f"provider computes (registered: {', '.join(token_statistic_names())}); install the plugin that registers it"
        )
    }
