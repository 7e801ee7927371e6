"""The process group DeepSpeed runs on: the torch.distributed environment of one process, DeepSpeed's comm init.

In one process :func:`ensure_distributed_env` sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT`` when they are absent (a free port), and DeepSpeed then runs with a world of one (gloo on CPU, nccl
on CUDA). Under ``torchrun``/``deepspeed`` the launcher's variables are used as they are.
"""

from __future__ import annotations

import os
import socket

import torch


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ENV_SET_HERE: list[str] = []


def ensure_distributed_env() -> None:
    """Fill in the torch.distributed environment of a single process where a launcher has not set it."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_PORT" not in os.environ:
        raise RuntimeError("WORLD_SIZE > 1 but MASTER_PORT is not set: start the ranks with torchrun or deepspeed")
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        if key not in os.environ:
            os.environ[key] = value
            _ENV_SET_HERE.append(key)
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = os.environ["RANK"]
        _ENV_SET_HERE.append("LOCAL_RANK")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
        _ENV_SET_HERE.append("MASTER_PORT")


def shutdown_distributed() -> None:
    """Destroy the process group DeepSpeed runs on and unset the variables :func:`ensure_distributed_env` set.

    For tests and notebooks that go on without DeepSpeed in the same process; every engine started before is
    unusable afterwards. A later ``DeepSpeedTrainingEngine.start`` initialises a fresh group.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()
    while _ENV_SET_HERE:
        os.environ.pop(_ENV_SET_HERE.pop(), None)


def init_deepspeed_distributed(backend: str = "auto") -> str:
    """Initialise DeepSpeed's communication backend once per process; returns the backend used.

    On CPU DeepSpeed's ``TorchBackend`` would JIT-compile its shared-memory ``shm_comm`` op (minutes on a small
    machine) the first time. That op only serves ``inference_all_reduce`` (AutoTP inference), never training, so it
    is marked incompatible in DeepSpeed's op table (``deepspeed.ops.__compatible_ops__``, a cached dict meant to
    be edited) and communication falls back to plain torch.distributed (gloo). Set ``RLZOO_DS_SHM_COMM=1`` to keep
    it.
    """
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    ensure_distributed_env()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if get_accelerator().device_name() == "cpu" and os.environ.get("RLZOO_DS_SHM_COMM", "0") != "1":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not dist.is_initialized():
        _forget_groups()
        _init_with_port_retry(
            lambda: deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
        )
    else:  # already initialised (an earlier engine, or the caller): DeepSpeed wraps the existing process group
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False)
    return dist.get_backend()


def _forget_groups() -> None:
    """Drop the groups DeepSpeed keeps for the process (``deepspeed.utils.groups``: its clone of the world group, the
    expert-parallel ones) before a fresh process group: those of an earlier engine belong to a group that is gone
    (vLLM's close destroys the default group of a process it ran in, as ``rlzoo mismatch --causes`` does between its
    measurements), and DeepSpeed would hand them to the new engine ("Group ... is not registered")."""
    from deepspeed.utils import groups

    groups._WORLD_GROUP = None
    for cached in (
        groups._EXPERT_PARALLEL_GROUP,
        groups._EXPERT_PARALLEL_GROUP_RANKS,
        groups._EXPERT_DATA_PARALLEL_GROUP,
        groups._EXPERT_DATA_PARALLEL_GROUP_RANKS,
        groups._ALL_TO_ALL_GROUP,
    ):
        cached.clear()


PORT_ATTEMPTS = 3


def _init_with_port_retry(init) -> None:
    """``init()``, again on a fresh port when the free port this module chose was taken before the store bound it
    (another library in the process, e.g. vLLM, may pick free ports at the same moment); a launcher's port is
    never changed."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            init()
            return
        except RuntimeError as err:  # torch's DistNetworkError is a RuntimeError
            if "MASTER_PORT" not in _ENV_SET_HERE or "EADDRINUSE" not in str(err) or attempt == PORT_ATTEMPTS - 1:
                raise
            os.environ["MASTER_PORT"] = str(_free_port())
