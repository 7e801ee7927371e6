"""Data-parallel runs: which process does what, and the few collectives the loop needs.

``rlzoo train`` started by a launcher (``torchrun --nproc_per_node N -m rlzoo.cli train CONFIG``, or the
``deepspeed`` launcher) runs one process per rank. :func:`setup` reads the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and initialises torch.distributed (gloo on CPU,
nccl on CUDA) before anything else, so the run driver can let rank 0 alone build the cold start, sample, score,
evaluate, log and write checkpoint metadata while every rank trains its share of each minibatch (and, with a
rollout engine that runs on every rank, samples its share of each step's prompts). The training engine
(DeepSpeed) then wraps the same process group.

Without a launcher (``WORLD_SIZE`` unset or 1) :data:`SINGLE` is used: every collective is the identity and no
process group is created here, so a one-process run computes exactly what it computed before this module existed.

The row split: every rank holds the whole rollout batch (broadcast from rank 0, or gathered from the ranks'
shares of the prompts, :meth:`Dist.share_items` and :meth:`Dist.all_gather_object`); of any list of row indices (the
whole batch for old log-probs, a minibatch for an update) rank ``r`` takes ``torch.tensor_split(rows, world)[r]``
(:meth:`Dist.share`), and :meth:`Dist.gather_rows` puts the ranks' ``[rows_r, ...]`` results back together in
that order.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")

#: how long a rank waits at a collective before it fails (rank 0 may be building the cold start or evaluating
#: meanwhile). Short enough that a rank whose peer died without the launcher noticing gives up within the hour;
#: a longer cold start is built first (``rlzoo sft CONFIG``) or given a longer timeout through the environment.
TIMEOUT_ENV = "RLZOO_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30 * 60


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world`` processes."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"  # where collective buffers live: "cpu" for gloo, "cuda:<local rank>" for nccl
    group: Any = None  # the process group of the collectives; None: the default one (see :meth:`side_group`)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def side_group(self) -> Dist:
        """The same ranks in a process group of their own (gloo, on the CPU), for the object collectives of a
        thread that runs beside the training loop (``rollout.max_staleness``'s producer: each rank samples its share
        and the shares are gathered while the main threads meet at the update's collectives; two threads must not
        share one group, whose collectives are matched by their order). Every rank calls it, in the same order."""
        if not self.active:
            return self
        import torch.distributed as dist

        return Dist(rank=self.rank, world=self.world, device="cpu", group=dist.new_group(backend="gloo"))

    # -- the row split ---------------------------------------------------------------------------------------

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of ``rows`` (all of them in one process)."""
        if not self.active:
            return rows
        return torch.tensor_split(rows, self.world)[self.rank]

    def share_items(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of a list (e.g. a step's prompts), split as :meth:`share` splits rows."""
        sizes = self.share_sizes(len(items))
        start = sum(sizes[: self.rank])
        return list(items[start : start + sizes[self.rank]])

    def share_sizes(self, count: int) -> list[int]:
        return [len(part) for part in torch.tensor_split(torch.arange(count), self.world)]

    def gather_rows(self, local: torch.Tensor, count: int) -> torch.Tensor:
        """Concatenate every rank's ``share`` of ``count`` rows (``local`` is this rank's); no gradient.

        The result is on ``local``'s device; in one process ``local`` itself is returned.
        """
        if not self.active:
            return local
        import torch.distributed as dist

        sizes = self.share_sizes(count)
        if local.shape[0] != sizes[self.rank]:
            mine = sizes[self.rank]
            raise ValueError(f"rank {self.rank} holds {local.shape[0]} rows, but its share of {count} is {mine}")
        width = max(sizes)
        buffer = local.detach().to(self.device)
        if buffer.shape[0] < width:  # all_gather needs equal shapes: pad, then cut each piece back
            pad = buffer.new_zeros((width - buffer.shape[0], *buffer.shape[1:]))
            buffer = torch.cat([buffer, pad])
        pieces = [torch.empty_like(buffer) for _ in range(self.world)]
        dist.all_gather(pieces, buffer.contiguous(), group=self.group)
        return torch.cat([piece[:size] for piece, size in zip(pieces, sizes)]).to(local.device)

    def gather_rows_differentiable(self, local: torch.Tensor, count: int) -> torch.Tensor:
        """Like :meth:`gather_rows`, but this rank's rows are ``local`` itself, so gradients flow into them.

        A loss computed on the result is the loss of all ``count`` rows; its gradient reaches this rank's rows only,
        and summing the ranks' parameter gradients gives the gradient of the whole minibatch.
        """
        if not self.active:
            return local
        full = self.gather_rows(local, count)
        sizes = self.share_sizes(count)
        start = sum(sizes[: self.rank])
        return torch.cat([full[:start], local, full[start + sizes[self.rank] :]])

    # -- objects ---------------------------------------------------------------------------------------------

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled: tensors arrive on the device they were sent from)."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.group, device=torch.device(self.device))
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (pickled; ``[obj]`` in one process)."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            if self.device.startswith("cuda"):
                dist.barrier(group=self.group, device_ids=[torch.device(self.device).index])
            else:
                dist.barrier(group=self.group)

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics combined over ranks, per key by the value's declared reduction
        (:func:`rlzoo.util.reductions.reduce_ranks`: a plain float is averaged, ``Min`` / ``Max`` keep the extreme; the
        classes survive the pickling of :meth:`all_gather_object`); ``time/*`` are rank 0's."""
        if not self.active:
            return metrics
        from rlzoo.util.reductions import reduce_ranks

        return reduce_ranks(self.all_gather_object(metrics))


SINGLE = Dist()
_OWNED = False  # whether setup() created the process group (teardown() destroys only that one)


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(backend: str = "auto") -> Dist:
    """The :class:`Dist` of this process; initialises torch.distributed when a launcher started several ranks.

    ``backend``: ``auto`` (nccl when CUDA is available, else gloo), ``gloo`` or ``nccl``. A process group that
    already exists (initialised by the caller) is used as it is. Also sets torch's CPU threads to
    ``max(1, cores // local processes)`` so the ranks of one machine do not oversubscribe its cores.
    """
    global _OWNED
    world = launched_world_size()
    if world <= 1:
        return SINGLE
    import torch.distributed as dist

    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RuntimeError(f"WORLD_SIZE={world} but {key} is not set: start the ranks with torchrun or deepspeed")
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    if not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)  # one GPU per rank
        timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
        dist.init_process_group(backend=backend, timeout=timeout)
        _OWNED = True
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, _cores() // max(local_world, 1)))
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), device=device)


def teardown(d: Dist) -> None:
    """Wait for every rank, then destroy the process group if :func:`setup` created it (end of a successful run)."""
    global _OWNED
    if not d.active:
        return
    import torch.distributed as dist

    d.barrier()
    if _OWNED and dist.is_initialized():
        dist.destroy_process_group()
        _OWNED = False


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


__all__ = ["Dist", "SINGLE", "setup", "teardown", "launched_world_size"]
