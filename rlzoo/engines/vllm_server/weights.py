"""The trainer side of a weight push to one vLLM server, through vLLM's RL API with rlzoo's gloo backend.

Once per server: ``/init_weight_transfer_engine`` with where the trainer hosts a two-party gloo group (the server
joins it while the trainer does: the request runs in a thread). Per push: ``/start_weight_update``, then
``/update_weights`` with the tensors' names, dtypes and shapes, which the server answers only after it has received
them all, so the trainer broadcasts each tensor while that request runs in a thread; then ``/finish_weight_update``
with the version string the server reports from then on (``/weight_info``). A push that fails leaves the server's
weights half loaded (on vLLM's meta device): the caller restarts or abandons that server, never ``/resume`` s it.

A failure on either side ends the push at once: the broadcasts run in a thread of their own, so a server that gave up
(its ``/update_weights`` answered an error) is not waited for by a broadcast it will never receive, and a broadcast
that broke on the trainer's side is not followed by waiting for the server's reply, which would come only when its
group times out (``transfer_timeout_s``). Those threads are daemons: one left blocked does not hold the process at
exit, as a ``ThreadPoolExecutor``'s worker would.

Reference: ``NCCLTrainerWeightTransferEngine.send_weights`` (``vllm/distributed/weight_transfer/nccl_engine.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any

import torch

from rlzoo.engines.vllm_server import gloo_group
from rlzoo.engines.vllm_server.client import ServerClient, ServerError


class GlooPusher:
    """Pushes named tensors to the server behind ``client`` over a gloo group set up by :meth:`connect`."""

    def __init__(self, client: ServerClient, host: str, timeout_s: float) -> None:
        self.client, self.host, self.timeout_s = client, host, timeout_s
        self.group: Any = None
        self.half_loaded = False  # the last push failed after the server started its update (weights on meta)
        self._sent = 0  # tensors of the push in progress broadcast so far

    def connect(self) -> None:
        """Join the gloo group with the server: both sides block until the other has joined, so the trainer joins
        in a thread and gives up as soon as the server's request fails (a server that never joins is not waited
        for until the group's timeout)."""
        port = gloo_group.free_port(self.host)
        info = {
            "master_address": self.host,
            "master_port": port,
            "rank": 1,
            "world_size": 2,
            "timeout_s": self.timeout_s,
        }
        request = self._in_thread("POST", "/init_weight_transfer_engine", {"init_info": info})
        joined: list[Any] = []
        joiner = threading.Thread(
            target=lambda: joined.append(gloo_group.join(self.host, port, 0, 2, self.timeout_s)),
            name="rlzoo-gloo-join",
            daemon=True,
        )
        joiner.start()
        while joiner.is_alive() and not request.done():
            joiner.join(0.1)
        request.result()  # the server's error, if it failed
        joiner.join(self.timeout_s)
        if not joined:
            raise ServerError(
                f"{self.client.url}: the weight-transfer group was not joined within {self.timeout_s:g} s"
            )
        self.group = joined[0]

    def push(self, weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        """Send ``weights`` (checkpoint names) as version ``version``; a failure raises :class:`ServerError`, with
        :attr:`half_loaded` telling whether the server had begun the update."""
        self.half_loaded = False
        if self.group is None:
            self.connect()
        self.half_loaded = True  # from the request on: the server may have moved its weights to the meta device
        self.client.call("POST", "/start_weight_update", timeout_s=self.timeout_s)
        info = {
            "names": [n for n, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
        }
        request = self._in_thread("POST", "/update_weights", {"update_info": info})
        sender = _in_daemon("rlzoo-weight-send", self._send, self.group, weights, request)
        wait([request, sender], return_when=FIRST_EXCEPTION)
        server_error = request.exception() if request.done() else None
        if server_error is not None:
            self.group = None  # the server left the broadcasts part-way: a later push joins a new group
            raise server_error
        if sender.exception() is not None:
            self.group = None
            raise ServerError(
                f"{self.client.url}: the weight transfer broke on the trainer's side after "
                f"{self._sent} of {len(weights)} tensors: {sender.exception()}"
            )
        self.client.call("POST", "/finish_weight_update", {"weight_version": version}, timeout_s=self.timeout_s)
        self.half_loaded = False

    def _send(self, group: Any, weights: list[tuple[str, torch.Tensor]], request: Future) -> None:
        self._sent = 0
        for _, tensor in weights:
            if request.done():  # the server gave up: its error, not a broadcast that waits for nobody
                return
            gloo_group.broadcast(group, tensor.contiguous())
            self._sent += 1

    def _in_thread(self, method: str, path: str, body: Any) -> Future:
        return _in_daemon("rlzoo-weight-push", self.client.call, method, path, body, self.timeout_s)

    def close(self) -> None:
        self.group = None


def _in_daemon(name: str, function: Callable[..., Any], *args: Any) -> Future:
    """``function(*args)`` in a daemon thread, its outcome in the returned future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


__all__ = ["GlooPusher", "ServerError"]
