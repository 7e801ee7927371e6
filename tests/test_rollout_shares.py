"""Rollouts on every rank: each rank samples and scores its contiguous share of a step's prompts with its own
engine and seed, and the gathered batch is the one a single engine would give for the same generations.

Two gloo processes (``torch.multiprocessing``, fake engine, no model, a few seconds) run :func:`rlzoo.rl.rollouts.collect`
with dynamic sampling, so further generation batches are split too; one process then replays the ranks'
generations through one engine and must get the same batch, rewards, advantages and metrics.
"""

from __future__ import annotations

import os
import random
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlzoo.config.schema import RunConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings, TrainingEngine
from rlzoo.interfaces import AdvantageSource, Sample, Verdict, Verifier
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components
from rlzoo.rl.rollouts import collect
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.seeds import rank_seed, step_seed
from rlzoo.util.timer import Timer

NAMES = ["same0", "mix0", "same1", "mix1", "mix2", "same2", "mix3", "mix4", "same3", "mix5", "mix6", "mix7"]
STEP, PROMPTS, GROUP = 3, 5, 4  # 5 prompts: shares of 3 and 2


class CharTokenizer:
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Seeded(RolloutEngine):
    """Responses drawn from (prompt, seed): "same*" prompts always get "b" (an uninformative group)."""

    name = "seeded"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list[str], int | None]] = []
        self.made: dict[str, list[Generation]] = {}

    def generate(self, prompts, sampling: SamplingSettings):
        texts = ["".join(map(chr, p)) for p in prompts]
        self.calls.append((texts, sampling.seed))
        out = []
        for text, ids in zip(texts, prompts):
            rng = random.Random(f"{text}/{sampling.seed}")
            group = []
            for _ in range(sampling.n):
                response = "b" if text.startswith("same") else rng.choice(["a", "b", "ab", "ba"])
                tokens = [ord(c) for c in response]
                group.append(Generation(list(ids), tokens, [-rng.random() for _ in tokens], True))
            self.made[text] = group
            out.append(group)
        return out


class Replay(RolloutEngine):
    """One engine that returns, for each prompt, the group some rank generated for it."""

    name = "replay"

    def __init__(self, made: dict[str, list[Generation]]) -> None:
        super().__init__()
        self.made = made

    def generate(self, prompts, sampling: SamplingSettings):
        return [self.made["".join(map(chr, p))] for p in prompts]


class IsA(Verifier):
    name = "is-a"

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(float(response == "a"))


class GroupCentered(AdvantageSource):
    name = "group-centered"

    def compute(self, batch):
        means = torch.stack([batch.rewards[batch.group_index == g].mean() for g in batch.group_index.tolist()])
        return (batch.rewards - means).unsqueeze(1) * batch.mask


def _parts(rollout: RolloutEngine, dist: Dist = SINGLE, per_rank: bool = False):
    from rlzoo.registry import default_registry

    config = RunConfig.model_validate(
        {"rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": 4}}
    )
    parts = Components(
        objective=None,
        advantage=GroupCentered(),
        verifier=IsA(),
        correction=None,
        rollout=rollout,
        learner=Learner(None),
        tokenizer=CharTokenizer(),
        dist=dist,
        rollout_per_rank=per_rank,
        batch_filter=default_registry().create("batch_filter", "dynamic-sampling", {"max_gen_batches": 3}),
        train_set=[Sample(name, "a") for name in NAMES],
    )  # type: ignore[arg-type]
    return config, parts


def _summary(rollout) -> dict:
    return {
        "generations": [(g.prompt_ids, g.response_ids, g.response_logprobs) for g in rollout.generations],
        "input_ids": rollout.batch.input_ids.tolist(),
        "rollout_logp": rollout.rollout_logp.tolist(),
        "rewards": rollout.rewards.rewards.tolist(),
        "token_rewards": rollout.rewards.token_rewards.tolist(),
        "advantages": default_registry().create("advantage", "group").compute(rollout.rewards).tolist(),
        "metrics": rollout.metrics,
    }


def _worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    engine = Seeded()
    config, parts = _parts(engine, Dist(rank=rank, world=world), per_rank=True)
    rollout = collect(STEP, parts.train_set[:PROMPTS], parts.rollout_parts(config), Timer())
    queue.put((rank, engine.calls, engine.made, _summary(rollout)))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def ranks() -> dict[int, tuple]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(2, port, queue), nprocs=2, join=True, start_method="spawn")
    results = [queue.get() for _ in range(2)]
    return {rank: rest for rank, *rest in results}


def test_each_rank_samples_its_contiguous_share_with_its_own_seed(ranks):
    calls0, calls1 = ranks[0][0], ranks[1][0]
    assert len(calls0) == len(calls1) >= 2  # dynamic sampling needed a further generation batch, split as well
    for batch, ((texts0, seed0), (texts1, seed1)) in enumerate(zip(calls0, calls1)):
        assert len(texts0) - len(texts1) in (0, 1) and texts1  # tensor_split: rank 0 takes the larger share
        expected = step_seed(0, STEP, 1) if batch == 0 else step_seed(0, STEP, 30_000 + batch)
        assert seed0 == expected == rank_seed(expected, 0) and seed1 == rank_seed(expected, 1) != seed0
    assert calls0[0][0] + calls1[0][0] == NAMES[:PROMPTS]  # contiguous shares, in prompt order


def test_every_rank_holds_the_batch_one_engine_gives_for_the_same_generations(ranks):
    assert ranks[0][2] == ranks[1][2]  # identical batches on both ranks
    made = {**ranks[0][1], **ranks[1][1]}
    config, parts = _parts(Replay(made))
    one = _summary(collect(STEP, parts.train_set[:PROMPTS], parts.rollout_parts(config), Timer()))
    two = ranks[0][2]
    assert two == one  # order, tokens, log-probs, rewards, group-relative advantages, filter and reward metrics
    assert len(one["generations"]) == PROMPTS * GROUP and any(a != 0 for row in one["advantages"] for a in row)
    assert one["metrics"]["filter/gen_batches"] >= 2


def test_share_items_splits_like_share():
    items = list("abcdefg")
    shares = [Dist(rank=r, world=3).share_items(items) for r in range(3)]
    assert shares == [list("abc"), list("de"), list("fg")]
    assert [Dist(rank=r, world=3).share(torch.arange(7)).tolist() for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert SINGLE.share_items(items) == items and Dist(rank=2, world=3).share_items(["x"]) == []
    assert len({rank_seed(12345, r) for r in range(8)}) == 8 and rank_seed(12345, 0) == 12345


class _Weights(TrainingEngine):
    name = "weights"

    def named_weights(self):
        return [("w", torch.ones(1))]


class _Receiver(RolloutEngine):
    name = "receiver"

    def __init__(self) -> None:
        super().__init__()
        self.synced = 0

    def sync_weights(self, named_tensors) -> None:
        self.synced += len(list(named_tensors))


@pytest.mark.parametrize("rank, every_rank, synced", [(0, False, 1), (1, False, 0), (1, True, 1), (0, True, 1)])
def test_push_weights_reaches_every_ranks_engine_when_each_samples(rank, every_rank, synced):
    receiver = _Receiver()
    Learner(_Weights(), Dist(rank=rank, world=2)).push_weights(receiver, every_rank=every_rank)
    assert receiver.synced == synced


class _LazyCollectiveWeights(TrainingEngine):
    """A ZeRO-3-like engine: named_weights is a lazy iterator whose every step is a gather all ranks take part in."""

    name = "lazy-collective"
    collective_weights = True

    def __init__(self) -> None:
        super().__init__()
        self.gathered = 0

    def named_weights(self):
        for name in ("a", "b", "c"):
            self.gathered += 1
            yield name, torch.ones(1)


@pytest.mark.parametrize("rank, every_rank", [(0, False), (1, False), (1, True)])
def test_every_rank_steps_through_a_collective_weight_iterator(rank, every_rank):
    # a rank that receives nothing must still take each gather, or the receiving rank's next one waits forever
    engine, receiver = _LazyCollectiveWeights(), _Receiver()
    learner = Learner(engine, Dist(rank=rank, world=2))
    learner.push_weights(receiver, every_rank=every_rank)
    assert engine.gathered == 3
    receives = rank == 0 or every_rank
    assert receiver.synced == (3 if receives else 0)
    update = learner.capture_weights(every_rank=every_rank)
    assert engine.gathered == 6 and (update is not None) == receives
