"""The trainer side of a weight push to vLLM servers: one gloo group holds the trainer and every server's workers, so
one broadcast per tensor reaches them all, through vLLM's RL API with rlzoo's gloo backend.

Joining (:meth:`WeightGroup.push`, whenever the servers it pushes to are not the ones in the group): each server says
how many workers it runs (``/get_world_size``: tensor x pipeline x data parallel); the trainer is rank 0 and server
``i``'s workers take the ranks after server ``i - 1``'s (``rank_offset``, as vLLM's NCCL backend numbers them). Every
server gets ``/init_weight_transfer_engine`` with where the trainer hosts the group's store, its offset and the world
size; all of them and the trainer join at once (the requests run in threads). Per push: ``/start_weight_update`` on
every server, then ``/update_weights`` with the tensors' names, dtypes and shapes on every server, each answered
only once that server has received them all, so the trainer broadcasts each tensor while those requests run; then
``/finish_weight_update`` with the version string each server reports from then on (``/weight_info``).

A push that does not complete on a server leaves that server's weights half loaded (on vLLM's meta device): it is
named in :class:`GroupPushError` and the caller restarts or abandons it, never ``/resume`` s it. In a shared group a
server that fails mid-push stops the broadcast for all (the others wait for tensors that never come), so every server
the push did not finish on is named; the group is joined afresh at the next push. A failure on either side ends the push at once: the
broadcasts run in a daemon thread, so a server that gave up part-way (and stopped reading) is not waited for by a
broadcast blocked until the group's timeout (``transfer_timeout_s``).

A server restarted after it died rejoins by membership: the caller pushes the current weights to the restarted
servers alone (a group of those only: the others hold the weights already and may be serving), and the next push to
every server re-creates the group for all of them. Re-creating costs one rendezvous (milliseconds); the alternative, a
group of its own for each restarted server kept from then on, would send each tensor once per group at every push,
which is what one group is for. Gloo connects every pair of ranks: servers on several machines must reach each other,
not only the trainer.

The trainer's weights arrive as an iterator (a ZeRO-3 trainer gathers one layer per step of it,
:mod:`rlzoo.engines.deepspeed.layerwise`); :class:`~rlzoo.engines.vllm_server.rollout.VllmServerRolloutEngine` copies
each tensor to host memory as it comes and hands the list here, so the trainer's device never holds the whole model.
vLLM accepts several ``/update_weights`` chunks in one update (``Worker.update_weights``: "one weight update chunk");
one request per push is kept because launched servers need the whole host copy again after a restart anyway.

Reference: ``NCCLTrainerWeightTransferEngine.send_weights`` and ``worker_init_process_group``
(``vllm/distributed/weight_transfer/nccl_engine.py``, ``nccl_common.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from rlzoo.engines.vllm_server import gloo_group
from rlzoo.engines.vllm_server.client import ServerClient, ServerError


class GroupPushError(ServerError):
    """A push (or the group's set-up) that failed on ``failed`` (dead, or weights half loaded: restart them); it
    completed on ``completed``; any other server of the push holds its previous weights, whole."""

    def __init__(
        self,
        message: str,
        failed: list[ServerClient],
        completed: list[ServerClient] | None = None,
        started: bool = True,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message, unreachable=unreachable)
        self.failed, self.completed = failed, completed or []
        self.started = started  # False: found before any update started, so ``failed`` are not half loaded


class WeightGroup:
    """Pushes named tensors to vLLM servers over one gloo group hosted at ``host`` (the trainer is rank 0)."""

    def __init__(self, host: str, timeout_s: float) -> None:
        self.host, self.timeout_s = host, timeout_s
        self.group: Any = None
        self.members: list[ServerClient] = []  # the servers in the group, in rank order
        self.world_size = 0
        self._calls = ThreadPoolExecutor(64, thread_name_prefix="rlzoo-weight-push")
        self._lock = threading.Lock()  # one push at a time (two restarted servers catch up one after the other)

    def push(self, clients: list[ServerClient], weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        """``weights`` into every server of ``clients``, each reporting ``version`` afterwards; one broadcast per
        tensor. Raises :class:`GroupPushError` naming the servers it did not complete on."""
        with self._lock:
            if self.group is None or [id(c) for c in clients] != [id(c) for c in self.members]:
                self._connect(clients)
            try:
                self._push(clients, weights, version)
            except GroupPushError:
                self.group, self.members = None, []  # the group is broken for everyone: joined afresh next time
                raise

    def _connect(self, clients: list[ServerClient]) -> None:
        """Every server of ``clients`` and the trainer join one new group; a server that fails stops the set-up (the
        others wait for it until ``timeout_s``, so they are named as failed too and restarted by the caller)."""
        self.group, self.members = None, []
        asked = [self._calls.submit(c.call, "GET", "/get_world_size", None, self.timeout_s) for c in clients]
        wait(asked, timeout=self.timeout_s)
        if failed := _failed(clients, asked, finished=True):  # nothing started yet: only these need a restart
            raise GroupPushError(
                f"before the push: {_first_error(asked) or 'no reply in time'}",
                failed,
                started=False,
                unreachable=_unreachable(asked),
            )
        sizes = [int(r.result()["world_size"]) for r in asked]
        world_size, port = 1 + sum(sizes), gloo_group.free_port(self.host)
        offsets = [1 + sum(sizes[:i]) for i in range(len(clients))]
        requests = [
            self._in_thread(
                client, "/init_weight_transfer_engine", {"init_info": self._init_info(port, off, world_size)}
            )
            for client, off in zip(clients, offsets, strict=True)
        ]
        joined: list[Any] = []
        joiner = threading.Thread(
            target=lambda: joined.append(gloo_group.join(self.host, port, 0, world_size, self.timeout_s)),
            name="rlzoo-gloo-join",
            daemon=True,
        )
        joiner.start()
        while joiner.is_alive() and not any(r.done() and r.exception() for r in requests):
            joiner.join(0.1)
        if joined:  # every rank is in: the servers' requests return now
            wait(requests, timeout=self.timeout_s)
        # not joined: the servers that did join wait for the rest until timeout_s, busy: all of them are named
        failed = _failed(clients, requests, finished=True) if joined else list(clients)
        if failed:
            raise GroupPushError(
                f"the weight-transfer group of {len(clients)} server(s) was not joined: "
                f"{_first_error(requests) or f'no reply within {self.timeout_s:g} s'}",
                failed,
                started=False,  # joining touches no weight
            )
        self.group, self.members, self.world_size = joined[0], list(clients), world_size

    def _init_info(self, port: int, rank_offset: int, world_size: int) -> dict[str, Any]:
        return {
            "master_address": self.host,
            "master_port": port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "timeout_s": self.timeout_s,
        }

    def _push(self, clients: list[ServerClient], weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        # a server that died since the last push is found before any update starts: the others stay whole (one
        # whose update started and never finished would be half loaded, and need a restart too)
        probes = [self._calls.submit(c.call, "GET", "/weight_info", None, self.timeout_s) for c in clients]
        wait(probes, timeout=self.timeout_s)
        if failed := _failed(clients, probes, finished=True):
            raise GroupPushError(
                f"before the push: {_first_error(probes) or 'no reply in time'}",
                failed,
                started=False,
                unreachable=_unreachable(probes),
            )
        started = [self._in_thread(client, "/start_weight_update", None) for client in clients]
        wait(started, timeout=self.timeout_s)
        if _failed(clients, started, finished=True):  # a server whose update started is on the meta device now
            raise GroupPushError(f"/start_weight_update failed: {_first_error(started)}", list(clients))
        info = {
            "names": [n for n, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
        }
        updates = [self._in_thread(client, "/update_weights", {"update_info": info}) for client in clients]
        # the broadcasts in a daemon thread of their own: a server that gave up part-way stops reading, and a
        # broadcast to it would block until the group's timeout; the push ends as soon as any side fails instead
        # (the thread, blocked or not, holds nothing the next push needs: that one joins a new group)
        sent = [0]
        sender = _in_daemon("rlzoo-weight-send", _broadcast_all, self.group, weights, updates, sent)
        wait([sender, *updates], timeout=self.timeout_s, return_when=FIRST_EXCEPTION)
        if sender.done() and sender.exception() is not None:  # a receiver's connection reset mid-broadcast
            raise GroupPushError(
                f"broadcast failed after {sent[0]} of {len(weights)} tensors: {sender.exception()}", list(clients)
            ) from sender.exception()
        if sender.done() and sent[0] == len(weights):  # each answers once it loaded them all; the others never will
            wait(updates, timeout=self.timeout_s)
        loaded = [c for c, u in zip(clients, updates, strict=True) if u.done() and u.exception() is None]
        body = {"weight_version": version}
        finished = [self._in_thread(client, "/finish_weight_update", body) for client in loaded]
        wait(finished, timeout=self.timeout_s)
        done = {id(c) for c, f in zip(loaded, finished, strict=True) if f.done() and f.exception() is None}
        failed = [c for c in clients if id(c) not in done]
        if failed:
            error = _first_error([*updates, *finished]) or "no reply in time"
            raise GroupPushError(f"the push did not complete: {error}", failed, [c for c in clients if id(c) in done])

    def _in_thread(self, client: ServerClient, path: str, body: Any) -> Future:
        return self._calls.submit(client.call, "POST", path, body, self.timeout_s)

    def close(self) -> None:
        self.group, self.members = None, []
        self._calls.shutdown(wait=False, cancel_futures=True)


def _failed(clients: list[ServerClient], requests: list[Future], finished: bool) -> list[ServerClient]:
    """The clients whose request failed, or (``finished``: all should have answered) did not succeed."""
    return [
        c
        for c, r in zip(clients, requests, strict=True)
        if (r.done() and r.exception() is not None) or (finished and not r.done())
    ]


def _broadcast_all(group: Any, weights: list[tuple[str, torch.Tensor]], updates: list[Future], sent: list[int]) -> None:
    for _, tensor in weights:
        if any(u.done() for u in updates):  # a server gave up: its error, not a broadcast nobody waits for
            return
        gloo_group.broadcast(group, tensor.contiguous())
        sent[0] += 1


def _in_daemon(name: str, function: Callable[..., Any], *args: Any) -> Future:
    """``function(*args)`` in a daemon thread, its outcome in the returned future: a thread left blocked does not
    hold the process at exit, as a ``ThreadPoolExecutor``'s worker would."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _unreachable(requests: list[Future]) -> bool:
    """Every request that failed found no server (no connection, or no reply in time): a server that stopped
    answering, not one that answered an error."""
    return all(not r.done() or r.exception() is None or getattr(r.exception(), "unreachable", False) for r in requests)


def _first_error(requests: list[Future]) -> str | None:
    errors = [r.exception() for r in requests if r.done() and r.exception() is not None]
    return str(errors[0]) if errors else None


__all__ = ["GroupPushError", "ServerError", "WeightGroup"]
