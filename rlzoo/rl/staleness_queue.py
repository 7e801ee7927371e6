"""A producer thread that runs ahead of its consumer by at most ``k`` weight versions, through a bounded queue.

The mechanism of ``rollout.max_staleness`` (:mod:`rlzoo.rl.async_rollouts`), kept free of engines so that a test can
drive it with random delays. Batches are numbered by the step that trains them; weight versions by the step whose
start they are (the weights that train step ``s`` are version ``s``)::

    producer (a thread)                                   consumer (the training loop)
    for i in first .. end-1:                              for s in first .. end-1:
        wait until  entered >= i - k                          entered <- s;  item <- take(s)       (waits)
               and  len(ready) < capacity                     train on item (staleness s - version(item) <= k)
        lock the generator: load the newest published         publish(s + 1, a copy of the new weights)
            weights (version v), item <- generate(i, v)
        ready <- ready + (i, v, item)

Why staleness never exceeds ``k``: batch ``i`` starts only after the consumer has entered step ``i - k``, which it
does after publishing version ``i - k``; so ``v >= i - k`` and batch ``i`` is trained at step ``i`` with version
``i``. Nothing is ever staler than ``k``, so no sample is dropped or regenerated (AReaL's ``max_head_offpolicyness``
gate works alike). With ``k = 0`` batch ``s`` starts only once the consumer asks for it: the synchronous loop's
order of work, so the consumer generates it itself and no thread is started (a second thread would only wait, and
its own OpenMP team alone slowed the real model's steps by ~11%: benchmarks/openmp_threads.py).

The generator is touched by the producer only while it holds :attr:`StalenessQueue.generator_lock`;
:meth:`StalenessQueue.paused` takes the lock from the consumer's side (evaluation uses the same engine) and loads
the newest weights first, so what is evaluated is the trained policy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

Item = TypeVar("Item")
Update = TypeVar("Update")


@dataclass
class Taken(Generic[Item]):
    """A produced batch as the consumer takes it."""

    item: Item
    version: int  # the weights version that generated it
    waited: float  # seconds the consumer waited for it
    ready: int  # batches ready in the queue when the consumer asked (this one included)


class StalenessQueue(Generic[Item, Update]):
    """Generates items ``first .. end-1`` in a thread, at most ``max_staleness`` versions ahead, ``capacity`` ready.

    ``generate(i, version)`` produces item ``i`` with the generator holding weights ``version``;
    ``load(update)`` puts published weights into the generator (called in the producer thread, between items, or
    by :meth:`paused`). The thread starts at the first :meth:`take` (with ``max_staleness`` 0 there is none:
    :meth:`take` generates).
    """

    def __init__(
        self,
        generate: Callable[[int, int], Item],
        load: Callable[[Update], None],
        first: int,
        end: int,
        max_staleness: int,
        capacity: int,
    ) -> None:
        if max_staleness < 0 or capacity < 1:
            raise ValueError(f"max_staleness {max_staleness} must be >= 0 and capacity {capacity} >= 1")
        self._generate, self._load = generate, load
        self.first, self.end, self.max_staleness, self.capacity = first, end, max_staleness, capacity
        self.generator_lock = threading.Lock()
        self._cond = threading.Condition()
        self._ready: dict[int, tuple[Item, int]] = {}
        self._entered = first - 1  # the step the consumer is in
        self._published: tuple[int, Update | None] = (first, None)  # the newest version and its weights
        self._loaded = first  # the version the generator holds
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- the consumer's side -----------------------------------------------------------------------------------------

    def take(self, index: int) -> Taken[Item]:
        """Item ``index`` (the consumer enters step ``index``), waiting for it if it is not ready yet."""
        started = time.perf_counter()
        with self._cond:
            if index != self._entered + 1:
                raise RuntimeError(f"step {index} taken after step {self._entered}: the steps are taken in order")
            self._entered = index
            ready = len(self._ready)  # before the producer hears of this step (so with k = 0 always 0)
            self._cond.notify_all()
        if self.max_staleness == 0:  # in lockstep: generated here, by the newest weights
            with self.generator_lock:
                version = self._load_newest()
                return Taken(self._generate(index, version), version, time.perf_counter() - started, ready)
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="rlzoo-rollout-producer", daemon=True)
            self._thread.start()
        with self._cond:
            self._cond.wait_for(lambda: index in self._ready or self._error is not None)
            self._raise_error()
            item, version = self._ready.pop(index)
            self._cond.notify_all()
        if index - version > self.max_staleness:  # the gate makes this impossible; a broken gate must not train
            raise RuntimeError(
                f"step {index}'s batch was generated by version {version}: staler than "
                f"max_staleness {self.max_staleness}"
            )
        return Taken(item, version, time.perf_counter() - started, ready)

    def publish(self, version: int, update: Update | None) -> None:
        """The weights of ``version`` (``None``: the previous version's weights, unchanged)."""
        with self._cond:
            newest, weights = self._published
            self._published = (version, update if update is not None else weights)
            self._cond.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No generation during the block (it waits for the one in flight), and the generator holds the newest
        published weights."""
        with self.generator_lock:
            self._raise_error()
            self._load_newest()
            yield

    def close(self) -> None:
        """Stop the producer (after the item it is generating); items not taken are dropped."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- the generator's side, during a generation (rollout.partial) -------------------------------------------------

    def newer_published(self) -> bool:
        """Weights newer than the generator's are published (a generation in flight may stop for them)."""
        with self._cond:
            return self._published[0] != self._loaded

    def load_in_flight(self) -> int:
        """Load the newest published weights into the generator in the middle of a generation (the caller holds
        the generator lock: the producer, inside ``generate``); their version. Tokens sampled after it are newer
        than the batch's version, so the bound on the batch's staleness still holds for every token."""
        return self._load_newest()

    @property
    def loaded(self) -> int:
        """The version of the weights the generator holds."""
        return self._loaded

    # -- the producer ------------------------------------------------------------------------------------------------

    def _produce(self) -> None:
        try:
            for index in range(self._entered, self.end):
                with self._cond:
                    self._cond.wait_for(partial(self._stopped_or_may_start, index))
                    if self._stop:
                        return
                with self.generator_lock:
                    version = self._load_newest()
                    item = self._generate(index, version)
                with self._cond:
                    self._ready[index] = (item, version)
                    self._cond.notify_all()
        except BaseException as error:  # raised in the consumer by take() or paused()
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _stopped_or_may_start(self, index: int) -> bool:
        return self._stop or self._may_start(index)

    def _may_start(self, index: int) -> bool:
        return self._entered >= index - self.max_staleness and len(self._ready) < self.capacity

    def _load_newest(self) -> int:
        """Under the generator lock: load the newest published weights if the generator lacks them."""
        with self._cond:
            version, update = self._published
        if version != self._loaded:
            if update is not None:
                self._load(update)
            self._loaded = version
        return self._loaded

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error
