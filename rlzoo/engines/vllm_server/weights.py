"""The trainer side of a weight push to one vLLM server, through vLLM's RL API with rlzoo's gloo backend.

Once per server: ``/init_weight_transfer_engine`` with where the trainer hosts a two-party gloo group (the server
joins it while the trainer does: the request runs in a thread). Per push: ``/start_weight_update``, then
``/update_weights`` with the tensors' names, dtypes and shapes, which the server answers only after it has received
them all, so the trainer broadcasts each tensor while that request runs in a thread; then ``/finish_weight_update``
with the version string the server reports from then on (``/weight_info``). A push that fails leaves the server's
weights half loaded (on vLLM's meta device): the caller restarts or abandons that server, never ``/resume`` s it.

Reference: ``NCCLTrainerWeightTransferEngine.send_weights`` (``vllm/distributed/weight_transfer/nccl_engine.py``).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlzoo.engines.vllm_server import gloo_group
from rlzoo.engines.vllm_server.client import ServerClient, ServerError


class GlooPusher:
    """Pushes named tensors to the server behind ``client`` over a gloo group set up by :meth:`connect`."""

    def __init__(self, client: ServerClient, host: str, timeout_s: float) -> None:
        self.client, self.host, self.timeout_s = client, host, timeout_s
        self.group: Any = None
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="rlzoo-weight-push")

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
        if self.group is None:
            self.connect()
        self.client.call("POST", "/start_weight_update", timeout_s=self.timeout_s)
        info = {
            "names": [n for n, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
        }
        request = self._in_thread("POST", "/update_weights", {"update_info": info})
        try:
            for _, tensor in weights:
                if request.done():  # the server gave up: its error, not a broadcast that waits for nobody
                    break
                gloo_group.broadcast(self.group, tensor.contiguous())
        finally:
            request.result()
        self.client.call("POST", "/finish_weight_update", {"weight_version": version}, timeout_s=self.timeout_s)

    def _in_thread(self, method: str, path: str, body: Any) -> Future:
        return self._calls.submit(self.client.call, method, path, body, self.timeout_s)

    def close(self) -> None:
        self.group = None
        self._calls.shutdown(wait=False, cancel_futures=True)


__all__ = ["GlooPusher", "ServerError"]
