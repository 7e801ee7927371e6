"""rlzoo.runtime.distributed: the row split, and why the loss is computed on the gathered minibatch.

Two gloo processes (``torch.multiprocessing``, no model, a few seconds) check that a loss computed on the
gathered log-probs of the whole minibatch (this rank's rows live, the others' detached) times the world size,
with gradients averaged over ranks, gives the one-process gradient and metrics for every built-in aggregation,
also when the ranks' shares differ in size; and that the naive per-rank loss does not for token-mean.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

# the spawned workers import this module: its top-level imports stay light (no registry, no transformers)
from rlzoo.runtime.distributed import SINGLE, Dist

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
ROWS, WIDTH, FEATURES = 7, 5, 3  # 7 rows: shares of 4 and 3


def test_one_process_collectives_are_the_identity():
    rows = torch.tensor([3, 1, 2])
    local = torch.randn(3, 4, requires_grad=True)
    assert SINGLE.share(rows) is rows and not SINGLE.active and SINGLE.is_main
    assert SINGLE.gather_rows(local, 3) is local and SINGLE.gather_rows_differentiable(local, 3) is local
    metrics = {"a": 1.0}
    assert SINGLE.broadcast(metrics) is metrics and SINGLE.reduce_metrics(metrics) is metrics
    assert [Dist(rank=r, world=3).share(torch.arange(7)).tolist() for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


def test_too_small_minibatches_for_the_world_are_a_clear_error():
    from rlzoo.config.resolution import build_config
    from rlzoo.errors import RlzooError
    from rlzoo.runtime.run import check_data_parallel

    config = build_config(
        {"rollout": {"prompts_per_step": 2, "group_size": 2}, "algorithm": {"minibatches_per_rollout": 2}}
    )
    check_data_parallel(config, 1)
    check_data_parallel(config, 2)  # 2 rows per minibatch: one each
    with pytest.raises(RlzooError, match="3 processes need at least 3 rows in every minibatch"):
        check_data_parallel(config, 3)


def _problem():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(ROWS, WIDTH, FEATURES, generator=generator)
    mask = torch.ones(ROWS, WIDTH)
    for row, length in enumerate([5, 1, 3, 4, 2, 5, 2]):  # unequal lengths: token-mean weights rows unequally
        mask[row, length:] = 0
    advantages = torch.randn(ROWS, 1, generator=generator).expand(ROWS, WIDTH).contiguous()
    old_logp = -torch.rand(ROWS, WIDTH, generator=generator)
    return features, mask, advantages, old_logp


def _objectives() -> dict:
    from rlzoo.rl.objective import build_objective

    clipper = {"name": "ppo", "eps_low": 0.05}
    return {name: build_objective({"aggregation": {"name": name}, "clipper": clipper}) for name in AGGREGATIONS}


def _gradients(dist: Dist, objective, gathered: bool):
    """(gradient of the shared weight, metrics) of one minibatch of all rows, as the loop computes them."""
    features, mask, advantages, old_logp = _problem()
    weight = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    rows = torch.arange(ROWS)
    local = dist.share(rows)
    logp = -torch.nn.functional.softplus(features[local] @ weight)  # this rank's forward pass
    if gathered:
        logp = dist.gather_rows_differentiable(logp, ROWS)
        loss, metrics = objective(logp, old_logp[rows], advantages[rows], mask[rows])
        loss = loss * dist.world
    else:  # the naive split: each rank's own loss on its own rows
        loss, metrics = objective(logp, old_logp[local], advantages[local], mask[local])
    loss.backward()
    grad = weight.grad.clone()
    if dist.active:
        torch.distributed.all_reduce(grad)
        grad /= dist.world  # what data-parallel engines do
    return grad, metrics


def _worker(rank: int, world: int, port: int, objectives: dict, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    dist = Dist(rank=rank, world=world)
    results = {}
    for aggregation, objective in objectives.items():
        for gathered in (True, False):
            grad, metrics = _gradients(dist, objective, gathered)
            results[aggregation, gathered] = (grad.tolist(), metrics)
    if rank == 0:
        queue.put(results)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def objectives() -> dict:
    return _objectives()


@pytest.fixture(scope="module")
def two_process_results(objectives):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_worker, args=(2, port, objectives, queue), nprocs=2, join=True, start_method="spawn")
    return queue.get()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gathered_loss_gives_the_one_process_gradient_and_metrics(aggregation, objectives, two_process_results):
    grad1, metrics1 = _gradients(SINGLE, objectives[aggregation], gathered=True)
    grad2, metrics2 = two_process_results[aggregation, True]
    assert torch.allclose(torch.tensor(grad2), grad1, atol=1e-7, rtol=1e-6)
    assert metrics2 == pytest.approx(metrics1, abs=1e-7)
    assert metrics1["clip/fraction"] > 0  # the clipper is active in the comparison


def test_a_per_rank_token_mean_would_weight_the_ranks_wrongly(objectives, two_process_results):
    grad1, _ = _gradients(SINGLE, objectives["token-mean"], gathered=True)
    naive, _ = two_process_results["token-mean", False]
    assert (torch.tensor(naive) - grad1).abs().max() > 1e-3


def test_a_chosen_port_taken_before_the_store_binds_it_is_replaced(monkeypatch):
    from rlzoo.engines.deepspeed import env as deepspeed_env

    monkeypatch.setattr(deepspeed_env, "_ENV_SET_HERE", ["MASTER_PORT"])
    monkeypatch.setenv("MASTER_PORT", "1")
    calls = []

    def init():
        calls.append(os.environ["MASTER_PORT"])
        if len(calls) == 1:
            raise RuntimeError("The server socket has failed to listen ... EADDRINUSE, message: address already in use")

    deepspeed_env._init_with_port_retry(init)
    assert len(calls) == 2 and calls[1] != "1"
    monkeypatch.setattr(deepspeed_env, "_ENV_SET_HERE", [])  # a launcher's port: the error stands
    with pytest.raises(RuntimeError, match="EADDRINUSE"):
        deepspeed_env._init_with_port_retry(lambda: (_ for _ in ()).throw(RuntimeError("EADDRINUSE")))
