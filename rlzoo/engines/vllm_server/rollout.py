"""Rollouts from a pool of vLLM servers (``rollout.engine: {name: vllm-server}``), on their own devices or machines.

Token ids in, token ids and raw log-probs out, through vLLM's OpenAI-compatible ``/v1/completions``
(:mod:`rlzoo.engines.vllm_server.client`); a step's prompt groups spread over the servers by load
(:mod:`rlzoo.engines.vllm_server.pool`); weights pushed after every optimizer step through vLLM's own
weight-transfer API with rlzoo's gloo backend, one group for every server (:mod:`rlzoo.engines.vllm_server.weights`),
each server then reporting the push's version, which every request checks. Under LoRA, when the run sends adapters,
each sync loads the adapter on every server under a new name instead (:mod:`rlzoo.engines.vllm_server.adapters`).
Where the servers come from: ``launch`` (child processes, :mod:`rlzoo.engines.vllm_server.launcher`), ``ray``
(placed on a running Ray cluster's nodes, :mod:`rlzoo.engines.vllm_server.ray_pool`; treated as launched servers
from then on) or ``servers`` (URLs).

With ``rollout.partial: continue|restart`` a generation follows weight updates in flight: every server paused with
its requests aborted, the push, resumed, the unfinished responses sent again (:mod:`rlzoo.engines.vllm_server.partial`).
What this engine does not do yet, each refused before the run by the capability it declares (the start-up check
names the field): recording MoE routing (R3), one engine per rank (``rollout.per_rank``). Evaluation and multi-turn
episodes use :meth:`generate` as any step does. Seeds: one per prompt as the in-process engine derives them, so a
server's samples are reproducible for a given pool, but not bitwise the in-process engine's.

Launch and Ray modes keep a host copy of the last pushed weights, so that a server restarted after it died (its
requests sent again) gets the trainer's current weights (or adapter) before it serves again; a push that did not
complete on such a server restarts it the same way (its weights are half loaded: never resumed).
"""

from __future__ import annotations

import atexit
import logging
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlzoo.engines.base import (
    Adapter,
    EngineContext,
    Generation,
    InFlightUpdates,
    RolloutEngine,
    SamplingSettings,
)
from rlzoo.engines.vllm_server import checks, options, partial
from rlzoo.engines.vllm_server.adapters import ServerAdapters
from rlzoo.engines.vllm_server.client import SERVED_MODEL, ServerClient, ServerError
from rlzoo.engines.vllm_server.describe import pool_lines
from rlzoo.engines.vllm_server.launcher import LaunchedServer, launch, node_command
from rlzoo.engines.vllm_server.pool import Server, ServerPool
from rlzoo.engines.vllm_server.weights import GroupPushError, WeightGroup
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import ModelShape, RolloutMemory

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig
    from rlzoo.engines.vllm_server.ray_pool import RayPool

logger = logging.getLogger(__name__)


class VllmServerRolloutEngine(RolloutEngine):
    """Samples from vLLM servers over HTTP; pushes weights with vLLM's weight-transfer API (gloo)."""

    name = "vllm-server"
    runs_under_launcher = True  # rank 0 calls the servers; nothing of it joins the run's process group
    runs_per_rank = False
    can_record_routing = False
    loads_adapters = True  # through /v1/load_lora_adapter (servers: with adapter_folder)
    updates_in_flight = True  # /pause?mode=abort, push, /resume, and the unfinished responses sent again (partial.py)
    context_option = "launch.max_model_len"

    Params = options.Params

    def __init__(self, params: options.Params | None = None) -> None:
        super().__init__(params)
        self.pool: ServerPool | None = None
        self.version = 0  # pushes so far; the string servers report after a push
        self.last_sync_seconds: float | None = None
        self._weights: list[tuple[str, torch.Tensor]] | None = None  # launch: the last push, for a restarted server
        self.group: WeightGroup | None = None  # the one gloo group of the trainer and every server
        self.adapters: ServerAdapters | None = None  # when the run sends LoRA adapters
        self._updates: InFlightUpdates | None = None  # rollout.partial: set by follow_updates
        # a push never runs beside a generation (a producer thread's); under rollout.partial the generation's own
        # thread pushes, between its requests (re-entered)
        self._lock = threading.RLock()
        self._at_exit = False
        self.ray_pool: RayPool | None = None  # ray: the placement group and the servers' actors
        # the options that start servers (launch or ray) and their place in the config, for messages
        self.source: options.ServerParams | None = self.params.launch or self.params.ray
        self.source_at = f"rollout.engine.{'ray' if self.params.ray is not None else 'launch'}"
        self.context_option = f"{self.source_at.rpartition('.')[2]}.max_model_len"

    # -- the start-up check ---------------------------------------------------------------------------------------

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """One source of servers, each usable as configured; an adapter rank vLLM serves (:mod:`.checks`)."""
        return checks.problems(self.params, run, at, self.name)

    def adapter_targets_supported(self, targets: list[str], moe: bool) -> str | None:
        return checks.adapter_problem(self.params, targets)

    def context_tokens(self) -> int | None:
        return self.source.max_model_len if self.source is not None else None

    def memory(self, config: RunConfig, shape: ModelShape, world: int) -> RolloutMemory:
        """Nothing on the trainer's devices; the pool's placement and each server's memory (``pool``, lines that
        ``rlzoo config check`` prints beside the trainer's estimate)."""
        return RolloutMemory(bytes=0, weights=0, pool=pool_lines(self.params, config, shape))

    def memory_hint(self, run: RunFacts) -> str:
        return "the rollout servers hold no memory on the trainer's devices"

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, context: EngineContext) -> None:
        self.context, p = context, self.params
        launched: list[LaunchedServer | None]
        if p.servers is None:
            log_dir = (context.run_dir or Path(tempfile.mkdtemp(prefix="rlzoo-servers-"))) / "rollout_servers"
            atexit.register(self.close)
            self._at_exit = True
            try:
                launched = list(self._start_servers(context, log_dir))
            except BaseException:  # an error, or SIGINT / SIGTERM while waiting: none is left running
                self.close()
                raise
            urls = [s.url for s in launched if s is not None]
        else:
            urls, launched = list(p.servers), [None] * len(p.servers)
            self._check_reachable(urls)
        servers = [Server(ServerClient(url, p.request_timeout_s), s) for url, s in zip(urls, launched, strict=True)]
        self.group = WeightGroup(p.trainer_address, p.transfer_timeout_s)
        if context.sends_adapters:  # the run's one rule (rlzoo.engines.lora.sends_adapters)
            self.adapters = ServerAdapters(Path(p.adapter_folder) if p.launch is None and p.adapter_folder else None)
        restarts = self.source.restarts if self.source is not None else 0
        self.pool = ServerPool(servers, p.requests_per_server, p.retries, restarts, self._restart)
        self.pool.restarts_option = f"{self.source_at}.restarts"
        try:
            if p.servers is not None:
                self._push_start_weights(context.model_dir)
            else:  # started from model_dir: the version they all report now (vLLM's initial one)
                reported = {server.client.weight_version() for server in servers}
                self.pool.expected_version = reported.pop() if len(reported) == 1 else None
        except BaseException:
            self.close()  # the run closes only an engine that started
            raise

    def _start_servers(self, context: EngineContext, log_dir: Path) -> list[LaunchedServer]:
        """Start the servers of ``launch`` (here) or ``ray`` (on the cluster), each answering ``/health``."""
        p = self.params
        if p.ray is not None:
            from rlzoo.engines.vllm_server.ray_pool import RayPool  # Ray is imported there, and only when used

            self.ray_pool = RayPool(p.ray, context, log_dir, p.trainer_address)
            return self.ray_pool.start()  # type: ignore[return-value]  # RayServer stands for a LaunchedServer
        count = len(p.launch.devices) if p.launch.devices else p.launch.count
        launched = [LaunchedServer(i, p.launch, context, log_dir) for i in range(count)]
        try:
            launch(launched, p.launch.startup_timeout_s)
        except BaseException:
            self.close_servers(launched)
            raise
        return launched

    def _check_reachable(self, urls: list[str]) -> None:
        """Every named server answers ``/health`` now: before any training, one line naming the first that does not."""
        for url in urls:
            client = ServerClient(url, 10.0)
            try:
                if not client.healthy(timeout_s=10.0):
                    raise RlzooError(
                        f"rollout.engine.servers: {url} does not answer /health (is a vLLM server "
                        "running there, started with VLLM_SERVER_DEV_MODE=1?)"
                    )
            finally:
                client.close()

    def _restart(self, server: Server) -> None:
        """A launched (or Ray) server that died: started again and given the trainer's current weights (or adapter)."""
        self._relaunch([server])
        if self.adapters is not None:
            self.adapters.catch_up(server.client, str(self.version))
        elif self._weights is not None:
            self._push_group([server], self._weights, str(self.version))

    def _relaunch(self, servers: list[Server]) -> None:
        """Stop ``servers`` for good (each its whole process group) and start them again, each on its port."""
        for server in servers:
            server.launched.stop()
        launch([s.launched for s in servers], self.source.startup_timeout_s, self.source_at)
        for server in servers:  # a new client: the weight group sees a new member and is joined afresh
            server.client.close()
            server.client = ServerClient(server.launched.url, self.params.request_timeout_s)

    def _count_restart(self, server: Server, exc: Exception) -> None:
        """One more restart of ``server`` after ``exc``; past ``launch.restarts`` the run stops."""
        if server.restarts >= self.source.restarts:
            raise RlzooError(
                f"rollout server {server.url} failed: {exc} (restarted {server.restarts} time(s) already, "
                f"{self.source_at}.restarts)"
            ) from exc
        server.restarts += 1

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if self._at_exit:
            atexit.unregister(self.close)
            self._at_exit = False
        if pool is not None:
            pool.close()
            for server in pool.servers:
                server.client.close()
            if self.group is not None:
                self.group.close()
            if self.adapters is not None:
                self.adapters.close()
                self.adapters = None
            self.close_servers([s.launched for s in pool.servers])
        ray_pool, self.ray_pool = self.ray_pool, None
        if ray_pool is not None:  # also when the start failed: the actors and the placement group, never the cluster
            ray_pool.close()

    @staticmethod
    def close_servers(launched: list[LaunchedServer | None]) -> None:
        for server in launched:
            if server is not None:
                server.stop()

    # -- sampling -------------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Generation]]:
        if self.pool is None:
            raise RuntimeError("VllmServerRolloutEngine.generate() before start()")
        eos = self.context.eos_token_id
        with self._lock:  # the adapter named is the one the servers hold until the next sync, which waits for this
            if self._updates is not None:  # rollout.partial: loads (this thread, the lock held) between requests
                seeds = [self._seed(sampling, i) for i in range(len(prompts))]
                options = lambda: (self._body(sampling), self._model())  # noqa: E731  # after a load: a new adapter
                return partial.generate_following(
                    self.pool, prompts, sampling, seeds, self._updates, eos, options, self._reported_now
                )
            body, model, n = self._body(sampling), self._model(), sampling.n
            jobs = [
                self._job(list(p), n, sampling.max_new_tokens, body, self._seed(sampling, i), model)
                for i, p in enumerate(prompts)
            ]
            groups = self.pool.map(jobs)
        return [[c.generation(prompt, eos) for c in group] for prompt, group in zip(prompts, groups, strict=True)]

    def _model(self) -> str:
        return self.adapters.model if self.adapters is not None else SERVED_MODEL

    def _body(self, sampling: SamplingSettings) -> dict:
        return dict(temperature=sampling.temperature, top_p=sampling.top_p, stop_token_ids=[self.context.eos_token_id])

    def _seed(self, sampling: SamplingSettings, index: int) -> int | None:
        """One seed per prompt, as the in-process engine derives it."""
        return None if sampling.seed is None else (sampling.seed * 1_000_003 + index * sampling.n) % 2**63

    @staticmethod
    def _job(prompt: list[int], n: int, max_tokens: int, body: dict, seed: int | None, model: str):
        body = body if seed is None else {**body, "seed": seed}
        return lambda client: client.complete(prompt, n, max_tokens, body, model)

    def follow_updates(self, updates: InFlightUpdates | None) -> None:
        self._updates = updates

    def _reported_now(self) -> str | None:
        """The weight version every live server reports now: the trainer's last push, or before any the servers'
        own (asked of one)."""
        if self.pool.expected_version is not None:
            return self.pool.expected_version
        return next(s for s in self.pool.servers if not s.dead).client.weight_version()

    # -- weights --------------------------------------------------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push checkpoint-format weights to every server; each then reports the new version."""
        if self.pool is None:
            raise RuntimeError("VllmServerRolloutEngine.sync_weights() before start()")
        started = time.perf_counter()
        self._push_all(named_tensors, self.version + 1)
        self.last_sync_seconds = time.perf_counter() - started

    def _push_all(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        dtype = getattr(torch, self.context.dtype)
        keep = self.source is not None  # a restarted server needs them again
        weights = [(name, t.detach().to("cpu", dtype=dtype, copy=keep)) for name, t in named_tensors]
        with self._lock:
            self._push_group(self.pool.servers, weights, str(version))
            self.version = version
            self.pool.expected_version = str(version)
            self._weights = weights if keep else None

    def _push_start_weights(self, model_dir: Path) -> None:
        """Servers started elsewhere may hold any weights (another run's): they get the model the trainer starts
        from (``model_dir``'s safetensors, checkpoint names), as version ``0``."""
        from safetensors.torch import load_file

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise RlzooError(f"{model_dir} holds no safetensors file to give the rollout servers")
        self._push_all([item for file in files for item in load_file(file).items()], 0)

    def _push_group(self, servers: list[Server], weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        """``weights`` to every live server of ``servers`` in one group push. A server it failed on is dead or has
        half-loaded weights (never resumed): a launched one is restarted, then it and every other server the push
        did not complete on get these weights (a group of those alone); the run stops on an external one."""
        targets = [s for s in servers if not s.dead]
        while targets:
            try:
                self.group.push([s.client for s in targets], weights, version)
                return
            except GroupPushError as exc:
                failed = [s for s in targets if any(s.client is c for c in exc.failed)]
                external = [s.url for s in failed if s.launched is None]
                state = (
                    "their weights may be half loaded (vLLM's meta device)" if exc.started else "no weight reached them"
                )
                if external and exc.unreachable:  # not answering, weights whole: left out, as the pool does
                    logger.warning("rollout server(s) %s left out of the pool: %s", ", ".join(external), exc)
                    for server in (s for s in failed if s.launched is None):
                        server.dead = True
                    targets = [s for s in targets if not s.dead]
                    if not targets:
                        raise RlzooError(f"no rollout server is left: every one stopped answering ({exc})") from exc
                    continue
                for server in failed:  # never sampled again before a restart, whatever happens next
                    server.dead = True
                if external:
                    raise RlzooError(
                        f"weight push to rollout server(s) {', '.join(external)} failed: {exc}; {state}, so they are "
                        "left out, never resumed: restart them, then run again (--resume continues from the last "
                        "checkpoint)"
                    ) from exc
                for server in failed:
                    self._count_restart(server, exc)
                logger.warning(
                    "weight push to rollout server(s) %s failed (%s; %s): restarting them",
                    ", ".join(s.url for s in failed),
                    exc,
                    state,
                )
                self._relaunch(failed)
                for server in failed:
                    server.dead = False
                for server in failed:
                    server.generation += 1
                targets = [s for s in targets if not any(s.client is c for c in exc.completed)]

    # -- LoRA adapters ----------------------------------------------------------------------------------------------

    def sync_adapter(self, adapter: Adapter) -> None:
        """Sample with ``adapter`` from now on: written to a new folder, loaded on every server under a new name."""
        if self.pool is None:
            raise RuntimeError("VllmServerRolloutEngine.sync_adapter() before start()")
        if self.adapters is None:
            raise RlzooError(
                "these rollout servers were started without LoRA (no model.lora, sync: merged, or targets they "
                "refuse): they receive the merged weights"
            )
        started = time.perf_counter()
        with self._lock:
            version = str(self.version + 1)
            alive = [s for s in self.pool.servers if not s.dead]
            for client, error in self.adapters.sync([s.client for s in alive], adapter, version):
                server = next(s for s in alive if s.client is client)
                if server.launched is None or not (isinstance(error, ServerError) and error.unreachable):
                    raise RlzooError(
                        f"rollout server {server.url} did not load LoRA adapter {self.adapters.name}: {error}"
                    ) from error
                self._count_restart(server, error)
                self._relaunch([server])
                server.generation += 1
                self.adapters.catch_up(server.client, version)
            self.version += 1
            self.pool.expected_version = version
        self.last_sync_seconds = time.perf_counter() - started


def node_command_for(engine: RolloutEngine, config: RunConfig, model: str, host: str, port: int) -> str:
    """``rlzoo serve-rollouts``: the shell line that starts one of ``engine``'s servers on another node (the
    launcher's own command line, :func:`rlzoo.engines.vllm_server.launcher.node_command`); one line naming
    ``rollout.engine`` for any other engine."""
    if not isinstance(engine, VllmServerRolloutEngine):
        raise RlzooError(
            f"rollout.engine: serve-rollouts prints the command of a vllm-server engine's server, not of "
            f"{engine.name!r} (set rollout.engine: {{name: vllm-server, servers: [...]}})"
        )
    source = engine.source  # launch's or ray's server options (the same server); their defaults for servers
    shared = source.model_dump(include=set(options.ServerParams.model_fields) - {"host"}) if source else {}
    launch = options.LaunchParams(**shared, host=host)
    return node_command(launch, model, config.model.dtype, config.seed, port)
