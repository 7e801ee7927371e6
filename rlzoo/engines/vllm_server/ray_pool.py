"""vLLM servers on a running Ray cluster (``rollout.engine.ray``): one placement group, one bundle and one small
actor per server, each server a process of its actor's node; the trainer stays a torchrun world outside Ray.

- **The cluster is never rlzoo's.** rlzoo joins it (``ray.init(address)``) and disconnects (``ray.shutdown``); it
  never starts nor stops it: a cluster is shared (other jobs, other users), and ``ray stop`` would end them all.
- **Placement.** One placement group for the pool, one bundle per server (``num_cpus`` CPUs, ``num_gpus`` GPUs).
  A bundle lies on one node, so a server's tensor-parallel workers (vLLM's own processes, not Ray's executor) share
  a node; one group for the pool reserves every server at once (all or none: never half a pool holding GPUs while it
  waits for the rest), lets Ray pack or spread the servers over nodes (``placement_strategy``), and is one removal.
- **A server on its node.** Each server's actor (its bundle's CPUs and GPUs: Ray sets ``CUDA_VISIBLE_DEVICES`` to
  its GPUs) runs the launcher's :class:`~rlzoo.engines.vllm_server.launcher.LaunchedServer` there: launch mode's
  command line, environment, log and port, on the node's address (or ``host``). Its supervisor is detached
  (``supervise --detach``): Ray SIGKILLs an actor's direct children when the actor ends, which would leave vLLM's
  processes running; the detached one takes the server's process group down when the actor is gone.
- **The trainer's side.** :class:`RayServer` stands for a launched server (start, alive, stop, its URL), so the
  engine treats these servers as launched ones: the launcher's health wait and port retry, restarts after a death
  (through the same actor on the same bundle, or a new actor there when the old one died), the one weight group,
  the version checks. The servers reach the trainer at ``trainer_address`` for weight pushes.
- **Teardown.** :meth:`RayPool.close` (every way out of the run: the engine's ``close``, its start's error path,
  the run's ``finally`` on SIGTERM, ``atexit``) stops each server through its actor, kills the actors, removes the
  placement group and disconnects. A trainer killed without that (SIGKILL): Ray ends the job's actors and removes
  its placement group, and each detached supervisor sees its actor gone and stops its server.
- **Checks at start**, each one line naming its field, before any training: the address answers, Ray joins it, a
  node can hold one server's bundle and the cluster the pool, the group is placed within ``startup_timeout_s``.

The model folder (and a LoRA run's ``adapter_folder``) must be at the same path on every node that holds a server
(one machine, or a shared filesystem), as for the sweep's Ray backend. Needs the ``ray`` extra.

Reference: verl and OpenRLHF place their vLLM engines with Ray placement groups (one bundle per engine's devices).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from rlzoo.engines.base import EngineContext
from rlzoo.engines.vllm_server.launcher import LaunchedServer, PortTaken, launch
from rlzoo.engines.vllm_server.options import RayParams
from rlzoo.errors import RlzooError

AT = "rollout.engine.ray"
RAY_MISSING = "places servers with Ray, which is not installed here: pip install 'rlzoo[ray]'"
CALL_TIMEOUT_S = 120.0  # one call to a server's actor (a stop takes up to 25 s)
#: what a server's actor takes from the trainer's environment (the rest is its node's): where Python finds rlzoo
#: and vLLM's plugins, the Hugging Face cache, and the user's vLLM settings (VLLM_*)
FORWARDED = ("PYTHONPATH", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def ray_installed() -> bool:
    return find_spec("ray") is not None


class ServerActor:
    """On a node, in its bundle: one server of the pool (a Ray actor; its methods run there)."""

    def __init__(self, index: int, params: RayParams, context: EngineContext, log_dir: str) -> None:
        import ray

        self.node = ray.get_runtime_context().get_node_id()
        host = params.host or ray.util.get_node_ip_address()
        launch = params.model_copy(update={"host": host})
        self.server = LaunchedServer(index, launch, context, Path(log_dir), detached=True)

    def start(self, port: int | None) -> tuple[str, int, str, int]:
        """Start the server on ``port`` (``None``: a free one); its host, port, node and process group."""
        self.server.port = port
        self.server.start()
        assert self.server.launch.host is not None and self.server.port is not None
        assert self.server.process is not None
        return self.server.launch.host, self.server.port, self.node, self.server.process.pid

    def alive(self) -> bool:
        return self.server.alive()

    def failed_start(self) -> tuple[str, bool]:
        """Why the server ended while starting, and whether its port was taken."""
        error = self.server.failed_start()
        return str(error), isinstance(error, PortTaken)

    def stop(self) -> None:
        self.server.stop()


class RayServer:
    """The trainer's handle on server ``index`` of ``pool``: what the launcher and the engine call a launched server
    (``start``, ``alive``, ``failed_start``, ``stop``, ``url``, ``port``, ``log_path``), done by its actor."""

    def __init__(self, index: int, pool: RayPool) -> None:
        self.index, self.pool = index, pool
        self.actor: Any = None
        self.host, self.node = "", ""  # where its actor started it
        self.port: int | None = None
        self.group = 0  # the server's process group on its node (its supervisor's session)
        self.log_path = pool.log_dir / f"server_{index}.log"  # on its node

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self.actor is None:
            self.actor = self.pool.new_actor(self.index)
        self.host, self.port, self.node, self.group = self.pool.call(self.actor.start.remote(self.port))

    def alive(self) -> bool:
        import ray

        try:
            return self.actor is not None and self.pool.call(self.actor.alive.remote())
        except ray.exceptions.RayError:
            return False

    def failed_start(self) -> RlzooError:
        import ray

        try:
            message, taken = self.pool.call(self.actor.failed_start.remote())
        except ray.exceptions.RayError as err:
            return RlzooError(f"rollout server {self.index}: its Ray actor ended: {str(err).splitlines()[0]}")
        return PortTaken(message) if taken else RlzooError(message)

    def stop(self) -> None:
        """Stop the server (its process group, on its node); the actor stays, to start it again."""
        import ray

        if self.actor is None:
            return
        try:
            self.pool.call(self.actor.stop.remote())
        except ray.exceptions.RayError:  # the actor died (its node, a kill): its supervisor stopped the server
            self.close()

    def close(self) -> None:
        """Stop the server and end its actor."""
        import ray

        actor, self.actor = self.actor, None
        if actor is None:
            return
        try:
            self.pool.call(actor.stop.remote())
        except ray.exceptions.RayError:
            pass
        ray.kill(actor)


class RayPool:
    """The servers of ``params`` on its cluster, serving ``context``'s model; their logs in ``log_dir`` of each
    node. ``trainer_address``: where the servers reach the trainer (checked against where they were placed)."""

    def __init__(self, params: RayParams, context: EngineContext, log_dir: Path, trainer_address: str) -> None:
        self.params, self.log_dir, self.trainer_address = params, log_dir, trainer_address
        # what the node needs of the context (its ``extra`` may hold anything, unpicklable too)
        self.context = EngineContext(
            model_dir=context.model_dir,
            dtype=context.dtype,
            seed=context.seed,
            lora=context.lora,
            sends_adapters=context.sends_adapters,
        )
        self.servers: list[RayServer] = []
        self.group: Any = None  # the placement group
        self._actor: Any = None  # ServerActor as a Ray actor class
        self._actor_options: dict[str, Any] = {}  # its bundle's resources, the trainer's environment it takes
        self._joined = False  # ray.init here (not a connection the process had already)

    def start(self) -> list[RayServer]:
        """Join the cluster, place the pool, start every server and wait until each answers ``/health``."""
        ray = self._join()
        bundle = self._bundle(ray)
        from ray.util.placement_group import placement_group

        self.group = placement_group(
            [bundle] * self.params.count, strategy=self.params.placement_strategy, name=f"rlzoo-rollout-{os.getpid()}"
        )
        try:
            ray.get(self.group.ready(), timeout=self.params.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RlzooError(
                f"{AT}: the cluster at {self.params.address} did not place {self.params.count} server(s) of "
                f"{bundle} ({self.params.placement_strategy}) within {self.params.startup_timeout_s:g} s "
                "(startup_timeout_s): other work holds its resources (`ray status` shows what is free)"
            ) from None
        self._actor = ray.remote(ServerActor)
        self._actor_options = {
            "num_cpus": bundle["CPU"],
            "num_gpus": bundle.get("GPU", 0),
            "runtime_env": {"env_vars": {k: v for k, v in os.environ.items() if k in FORWARDED or k[:5] == "VLLM_"}},
        }
        self.servers = [RayServer(i, self) for i in range(self.params.count)]
        launch(self.servers, self.params.startup_timeout_s, at=AT)
        self._check_reachable(ray)
        return self.servers

    def new_actor(self, index: int) -> Any:
        """Server ``index``'s actor, in its bundle of the pool's placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
        return self._actor.options(scheduling_strategy=strategy, **self._actor_options).remote(
            index, self.params, self.context, str(self.log_dir)
        )

    def call(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        """Stop every server, end the actors, remove the placement group, leave the cluster; never stops it."""
        if not ray_installed():
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        servers, self.servers = self.servers, []
        for server in servers:
            server.close()
        group, self.group = self.group, None
        if group is not None and ray.is_initialized():
            remove_placement_group(group)
        if self._joined:
            self._joined = False
            ray.shutdown()  # this process's connection only

    # -- checks at start ----------------------------------------------------------------------------------------------

    def _join(self) -> Any:
        """``ray.init`` on the address (or the connection this process has): one line when nothing answers."""
        if not ray_installed():
            raise RlzooError(f"{AT}: {RAY_MISSING}")
        import ray

        if ray.is_initialized():
            return ray
        address = self.params.address
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if host and port.isdigit():
            try:
                socket.create_connection((host, int(port)), timeout=10.0).close()
            except OSError as err:
                raise RlzooError(
                    f"{AT}.address: nothing answers at {address} ({err.strerror or err}): start the cluster there "
                    f"first (`ray start --head --port {port}`; rlzoo never starts or stops it)"
                ) from None
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as err:  # ConnectionError, AuthenticationError, ...: Ray's first line says which
            cause = f"{_first_line(err)} ({_reason(err.__cause__)})" if err.__cause__ else _first_line(err)
            if "token" in cause.lower():
                cause += ": set RAY_AUTH_MODE=token here, the cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
            raise RlzooError(f"{AT}.address: cannot join the Ray cluster at {address}: {cause}") from None
        self._joined = True
        return ray

    def _bundle(self, ray: Any) -> dict[str, float]:
        """One server's bundle; refused when no node can hold it, or the cluster not the whole pool."""
        p, tp = self.params, self.params.tensor_parallel_size
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        has_gpus = any(n.get("GPU", 0) > 0 for n in nodes)
        gpus = p.num_gpus if p.num_gpus is not None else (tp if has_gpus else 0)
        if gpus == 0 and tp > 1:
            raise RlzooError(
                f"{AT}.tensor_parallel_size: {tp} needs GPUs, and the cluster at {p.address} has none "
                f"({'num_gpus: 0' if p.num_gpus == 0 else 'no node offers a GPU'}); use 1"
            )
        bundle = {"CPU": float(p.num_cpus), **({"GPU": float(gpus)} if gpus else {})}
        fits = [_servers_fitting(n, bundle) for n in nodes]
        if not any(fits):
            most_gpus = max((n.get("GPU", 0) for n in nodes), default=0)
            field, what = (
                ("tensor_parallel_size", f"{gpus} GPUs on one node (the most any node has: {most_gpus:g})")
                if gpus > most_gpus
                else ("num_cpus", f"{p.num_cpus:g} CPUs on one node")
            )
            raise RlzooError(
                f"{AT}.{field}: no node of the cluster at {p.address} can hold one server ({what}): a server's "
                "tensor-parallel workers share one node"
            )
        room = {
            "STRICT_PACK": max(fits),
            "STRICT_SPREAD": sum(1 for f in fits if f),
        }.get(p.placement_strategy, sum(fits))
        if room < p.count:
            raise RlzooError(
                f"{AT}.count: the cluster at {p.address} holds at most {room} server(s) of {bundle} with "
                f"placement_strategy {p.placement_strategy}, not {p.count}"
            )
        return bundle

    def _check_reachable(self, ray: Any) -> None:
        """Servers on other nodes must reach the trainer, and the trainer them: not on a loopback address."""
        here = ray.get_runtime_context().get_node_id()
        elsewhere = [s for s in self.servers if s.node != here]
        if not elsewhere:
            return
        names = ", ".join(s.url for s in elsewhere)
        if _loopback(self.trainer_address):
            raise RlzooError(
                f"rollout.engine.trainer_address: {self.trainer_address} is this machine's loopback, and server(s) "
                f"{names} are on other nodes: set it to an address of this machine they reach"
            )
        if any(_loopback(s.host) for s in elsewhere):
            raise RlzooError(f"{AT}.host: server(s) {names} on other nodes listen on loopback: use null")


def _servers_fitting(node: dict[str, float], bundle: dict[str, float]) -> int:
    """How many bundles ``node``'s resources hold (totals: what other work holds is the placement's wait)."""
    return int(min(node.get(name, 0.0) // amount for name, amount in bundle.items()))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _reason(err: BaseException) -> str:
    """The error a Ray error's text ends with (it quotes a whole traceback), at most 200 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.partition(":")[0]]
    return (named[-1] if named else _first_line(err))[:200]


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
