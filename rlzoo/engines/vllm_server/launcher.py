"""vLLM servers that rlzoo starts itself (``rollout.engine.launch``): child processes on free ports, one log each.

Each server runs under :mod:`rlzoo.engines.vllm_server.supervise` in a session of its own, so one signal to its
process group stops the server with everything vLLM started (engine core, workers), and the supervisor takes the
group down when the trainer dies, even by SIGKILL. :meth:`LaunchedServer.stop` signals the group (SIGTERM, then
SIGKILL) and reaps it; the pool calls it on every way out of the run (close, an exception, SIGTERM through the
run's ``finally``; an ``atexit`` hook for the rest). A server that exits while starting is reported with the last
line of its log; one that found its port taken is started again on another port.

Environment of a server: ``VLLM_SERVER_DEV_MODE=1`` (vLLM's RL routes), ``CUDA_VISIBLE_DEVICES`` from
``launch.devices``, and not ``VLLM_ENABLE_V1_MULTIPROCESSING`` (the in-process engine's setting); when the run sends
LoRA adapters, ``--enable-lora`` on their targets, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (vLLM's adapter routes) and
rlzoo's ``RLZOO_VLLM_CPU_MOE_LORA=1`` (:mod:`rlzoo.engines.vllm_server.adapters`). The server loads
rlzoo's gloo backend through the ``vllm.general_plugins`` entry point, which ``pip install -e .`` registers.

:func:`node_command` is the same server as one shell line for another node (``rlzoo serve-rollouts``), built by the
same :func:`~rlzoo.engines.vllm_server.options.server_arguments`. Servers on a Ray cluster
(:mod:`rlzoo.engines.vllm_server.ray_pool`) are these servers too, each started by an actor on its node
(``detached``), and :func:`launch` / :func:`wait_healthy` take the trainer's handles on them as they take launched ones.

Reference: TRL's ``trl vllm-serve`` (a server the trainer reaches over HTTP); vLLM's own server tests start
``vllm serve`` as a subprocess and poll ``/health`` the same way.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from rlzoo.engines.base import EngineContext
from rlzoo.engines.vllm.lora import CPU_MOE_LORA_ENV
from rlzoo.engines.vllm_server.adapters import lora_arguments
from rlzoo.engines.vllm_server.client import ServerClient
from rlzoo.engines.vllm_server.gloo_group import free_port
from rlzoo.engines.vllm_server.options import SERVER_ENV, LaunchParams, ServerParams, server_arguments
from rlzoo.engines.vllm_server.supervise import others_alive
from rlzoo.errors import RlzooError

logger = logging.getLogger(__name__)
PLUGIN = "rlzoo.engines.vllm_server.gloo_transfer:register"
PORT_TRIES = 3


def plugin_installed() -> bool:
    """Whether this environment registers rlzoo's gloo backend with vLLM (``vllm.general_plugins``)."""
    return any(e.value == PLUGIN for e in entry_points(group="vllm.general_plugins"))


def node_command(launch: LaunchParams, model: str, dtype: str, seed: int, port: int) -> str:
    """The shell line that starts one server of ``launch`` by hand (on another node): its environment, then the
    command line the launcher runs, with ``python`` for this environment's interpreter."""
    env = " ".join(f"{name}={value}" for name, value in SERVER_ENV.items())
    return f"{env} {shlex.join(server_arguments(launch, model, dtype, seed, port, python='python'))}"


class StartedServer(Protocol):
    """What :func:`launch` and :func:`wait_healthy` start and watch: a :class:`LaunchedServer`, or the trainer's
    handle on a server a Ray actor starts on its node (:class:`rlzoo.engines.vllm_server.ray_pool.RayServer`)."""

    index: int
    port: int | None
    log_path: Path

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def failed_start(self) -> RlzooError: ...

    def stop(self) -> None: ...


class PortTaken(RlzooError):
    """The server could not bind its port (another process took it between the choice and the bind)."""


class LaunchedServer:
    """Server ``index`` of ``launch``, serving ``context``'s model; its log in ``log_dir``. ``detached``: its
    supervisor is no child of this process (a Ray actor's server: ``supervise --detach``), so it is watched and
    stopped through its process group alone."""

    def __init__(
        self,
        index: int,
        launch: ServerParams,
        context: EngineContext,
        log_dir: Path,
        port: int | None = None,
        detached: bool = False,
    ):
        self.index, self.launch, self.context, self.detached = index, launch, context, detached
        self.log_path = log_dir / f"server_{index}.log"
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.launch.host}:{self.port}"

    def start(self) -> None:
        """Start the server (returns at once; :meth:`wait_healthy` waits), on ``port`` or a free one."""
        assert self.launch.host is not None  # a Ray server's node sets it
        if self.port is None:
            self.port = free_port(self.launch.host)
        env = {**os.environ, **SERVER_ENV}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        if isinstance(self.launch, LaunchParams) and self.launch.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.launch.devices[self.index]  # a Ray server's: its actor's, from Ray
        lora = None
        if self.context.sends_adapters and self.context.lora is not None:
            lora = lora_arguments(self.context.lora)
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
            env[CPU_MOE_LORA_ENV] = "1"  # the plugin keeps the CPU MoE kernel under LoRA (a no-op off CPU)
        command = server_arguments(
            self.launch, str(self.context.model_dir), self.context.dtype, self.context.seed, self.port, lora
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- rlzoo: {' '.join(command)}\n".encode())
            log.flush()
            detach = ["--detach"] if self.detached else []
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rlzoo.engines.vllm_server.supervise",
                    *detach,
                    str(os.getpid()),
                    "--",
                    *command,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        if self.detached:
            self.process.wait(60)  # it forks the supervisor and exits: reaped here, its PID stays the group's id

    def alive(self) -> bool:
        if self.detached:
            return self.process is not None and others_alive(self.process.pid)
        return self.process is not None and self.process.poll() is None

    def failed_start(self) -> RlzooError:
        """Why the server ended while starting: the last line of its log that says something."""
        lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line] or lines or ["(empty log)"]
        if any("address already in use" in line.lower() for line in lines[-40:]):
            return PortTaken(f"rollout server {self.index}: port {self.port} is in use")
        return RlzooError(
            f"rollout server {self.index} ({self.url}) exited while starting: {errors[-1][:300]} (log: {self.log_path})"
        )

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 15 s; the supervisor reaped."""
        process, self.process = self.process, None
        if process is None:
            return
        if self.detached:
            _stop_group(process.pid)
            return
        for signum, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            try:
                process.wait(wait_s)
                if signum == signal.SIGKILL or not _group_alive(process.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the group outlived its leader
        except ProcessLookupError:
            pass
        process.poll()


def _stop_group(group: int) -> None:
    """SIGTERM to ``group`` (its supervisor passes it on), SIGKILL after 15 s; returns once none of it runs."""
    for signum, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while others_alive(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not others_alive(group):
            return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def wait_healthy(servers: Sequence[StartedServer], timeout_s: float, at: str = "rollout.engine.launch") -> None:
    """Until every server answers ``/health``, a progress line every 15 s; a server that exits is an error.
    ``at``: the servers' options in the config, for the messages."""
    started, told = time.monotonic(), 0.0
    waiting = list(servers)
    clients = {id(s): ServerClient(s.url, 5.0) for s in servers}
    try:
        while waiting:
            for server in list(waiting):
                if clients[id(server)].healthy(timeout_s=2.0):
                    waiting.remove(server)
                elif not server.alive():
                    raise server.failed_start()
            elapsed = time.monotonic() - started
            if waiting and elapsed > timeout_s:
                names = ", ".join(f"{s.index} ({s.url}, log {s.log_path})" for s in waiting)
                raise RlzooError(
                    f"{at}.startup_timeout_s: rollout server(s) {names} did not answer /health within {timeout_s:g} s"
                )
            if waiting and elapsed - told >= 15.0:
                told = elapsed
                print(
                    f"rollout servers: {len(servers) - len(waiting)}/{len(servers)} ready after {elapsed:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if waiting:
                time.sleep(1.0)
    finally:
        for client in clients.values():
            client.close()


def launch(servers: Sequence[StartedServer], timeout_s: float, at: str = "rollout.engine.launch") -> None:
    """Start ``servers`` and wait until all are healthy; one whose port was taken starts again on another port."""
    for server in servers:
        server.start()
    for attempt in range(PORT_TRIES):
        try:
            wait_healthy(servers, timeout_s, at)
            return
        except PortTaken as taken:
            if attempt + 1 == PORT_TRIES:
                raise
            logger.warning("%s: starting it on another port", taken)
            for server in servers:
                if not server.alive():
                    server.stop()
                    server.port = None
                    server.start()
