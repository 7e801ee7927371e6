"""A gloo process group outside ``torch.distributed``'s default one, joined by the trainer and the servers' workers.

Both sides build it the same way: a ``TCPStore`` (the trainer, rank 0, hosts it) and a ``ProcessGroupGloo`` on it,
never ``init_process_group``, so neither the trainer's own process group (DeepSpeed's) nor vLLM's inside the server
is touched. The trainer then broadcasts each tensor from rank 0 (:mod:`rlzoo.engines.vllm_server.weights`); the
servers receive it in vLLM's workers (:mod:`rlzoo.engines.vllm_server.gloo_transfer`). This module imports only torch,
so the trainer side needs no vLLM.

Reference: vLLM's ``StatelessProcessGroup`` / ``stateless_init_torch_distributed_process_group``
(``vllm/distributed/utils.py``) build their groups the same way.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

PREFIX = "rlzoo-weights"
BACKEND = "rlzoo-gloo"  # the name vLLM knows the server side by (gloo_transfer.register)


#: ports :func:`free_port` gave this process: one handed out may not be bound yet (a server still starting), and the
#: kernel may offer it again once the probe is closed -- two servers launched one after the other got the same port,
#: the second failed to bind while the first answered both URLs' health checks
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's choice), never one this process was given before."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free TCP port on {host} that this process has not handed out already")


def join(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    """Join the group: rank 0 hosts the store on ``host:port``; returns once every rank has joined."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    return dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, store), rank, world_size, timeout)


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    """Rank 0's ``tensor`` into every rank's ``tensor`` (in place), waited for."""
    group.broadcast([tensor], dist.BroadcastOptions()).wait()
