"""The servers a run samples from, and a step's prompt groups spread over them by load.

Each prompt group is one ``/v1/completions`` request (``n`` = the group's size) sent by a thread of a pool of
``len(servers) x requests_per_server`` threads to the server with the fewest requests in flight at that moment, so
a faster (or less loaded) server takes more groups. Before each request the server's weight version
(``/weight_info``) is compared with the trainer's: a server that disagrees is refused with an error, never used.

A server that stops answering: one rlzoo launched (or placed on a Ray cluster) is restarted (``restarts`` times in all), given the
trainer's current weights again, and the group is sent again; one started elsewhere is left out for the rest of the
run and the group goes to another server (``retries`` times), and when none is left the run stops with the error.

Reference: prime-rl's orchestrator and TRL's vLLM client (a trainer that sends requests to a server pool).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from rlzoo.engines.vllm_server.client import ServerClient, ServerError
from rlzoo.engines.vllm_server.launcher import LaunchedServer
from rlzoo.errors import RlzooError

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Server:
    """One server of the pool: how to call it and (when rlzoo launched it) restart it; the engine's weight group
    pushes to it through ``client``."""

    client: ServerClient
    launched: LaunchedServer | None = None
    in_flight: int = 0
    served: int = 0  # requests answered
    dead: bool = False
    restarts: int = 0
    generation: int = 0  # restarts done: a thread that saw an older one need not restart it again
    lock: threading.Lock = field(default_factory=threading.Lock)  # one restart at a time

    @property
    def url(self) -> str:
        return self.client.url


class VersionMismatch(RlzooError):
    """A server holds other weights than the trainer pushed."""


class ServerPool:
    """Sends prompt groups to ``servers``; ``restart(server)`` brings a launched server back with current weights."""

    def __init__(
        self,
        servers: list[Server],
        requests_per_server: int,
        retries: int,
        max_restarts: int,
        restart: Callable[[Server], None],
    ) -> None:
        self.servers, self.retries, self.max_restarts, self.restart = servers, retries, max_restarts, restart
        self.expected_version: str | None = None  # None: the servers' own (before the first push)
        self.restarts_option = "rollout.engine.launch.restarts"  # the option that limits restarts (ray's too)
        self._choose = threading.Lock()
        self._threads = ThreadPoolExecutor(len(servers) * requests_per_server, thread_name_prefix="rlzoo-rollout")

    def map(self, jobs: list[Callable[[ServerClient], T]]) -> list[T]:
        """Each job run against a server of the pool, concurrently; the results in order (the first error raised)."""
        return [f.result() for f in self.submit(jobs)]

    def submit(self, jobs: list[Callable[..., T]], with_version: bool = False) -> list[Future[T]]:
        """Each job started against a server of the pool; ``with_version``: called as ``job(client, reported)``,
        ``reported`` the weight version the server reported just before (checked as always)."""
        return [self._threads.submit(self._run, job, with_version) for job in jobs]

    def _run(self, job: Callable[..., T], with_version: bool = False) -> T:
        failures = 0
        while True:
            server = self._acquire()
            generation = server.generation
            try:
                reported = self.check_version(server, with_version)
                result = job(server.client, reported) if with_version else job(server.client)
                server.served += 1
                return result
            except ServerError as exc:
                if not exc.unreachable:
                    raise
                failures += 1
                self._failed(server, exc, failures, generation)
            finally:
                with self._choose:
                    server.in_flight -= 1

    def _acquire(self) -> Server:
        with self._choose:
            alive = [s for s in self.servers if not s.dead]
            if not alive:
                raise RlzooError("no rollout server is left: every one stopped answering (see the errors above)")
            server = min(alive, key=lambda s: s.in_flight)
            server.in_flight += 1
            return server

    def _failed(self, server: Server, exc: ServerError, failures: int, generation: int) -> None:
        """``server`` (as it was at restart ``generation``) did not answer: restart it (launched) or leave it out
        (external); raise past the limits."""
        if server.launched is None:
            logger.warning("rollout server %s left out of the pool: %s", server.url, exc)
            server.dead = True
            if failures > self.retries:
                raise exc
            return
        with server.lock:
            if server.generation != generation:  # another thread restarted it meanwhile (asking /health instead
                return  # would restart a busy server that answers late)
            if server.restarts >= self.max_restarts:
                server.dead = True
                raise RlzooError(
                    f"rollout server {server.url} stopped answering and was restarted "
                    f"{server.restarts} time(s) already ({self.restarts_option}): {exc}"
                ) from exc
            server.restarts += 1
            logger.warning("rollout server %s stopped answering (%s): restarting it", server.url, exc)
            self.restart(server)
            server.generation += 1

    def check_version(self, server: Server, always: bool = False) -> str | None:
        """Refuse ``server`` when its weight version is not the one the trainer pushed last; the version it reported
        (``None`` when nothing was pushed yet, unless asked ``always``)."""
        if self.expected_version is None and not always:
            return None
        reported = server.client.weight_version()
        if self.expected_version is None:
            return reported
        if reported != self.expected_version:
            raise VersionMismatch(
                f"rollout server {server.url} reports weight version {reported!r}, the trainer "
                f"pushed {self.expected_version!r}: refused (another trainer or a restart without "
                "weights changed it)"
            )
        return reported

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
