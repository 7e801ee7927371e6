"""The vllm-server engine's start-up check (``rlzoo config check``, before the run): where its servers come from and
whether they can serve this run.

Exactly one of ``launch``, ``servers`` or ``ray``; URLs that are http(s); for ``launch`` vLLM and rlzoo's vLLM
plugin installed here, devices that fit ``tensor_parallel_size``; for ``ray`` Ray installed here (the ``ray``
extra), a cluster address, GPUs for tensor parallelism (``num_gpus`` 0 or ``tensor_parallel_size``: a server's
workers are its bundle's GPUs); for both the in-process engine's rules for the KV cache and the context
(:func:`rlzoo.engines.vllm.limits.model_problems`); under LoRA an adapter rank vLLM serves. What needs the cluster
itself (it answers, a node holds one server, the pool fits) is checked when the run starts, before any training
(:mod:`rlzoo.engines.vllm_server.ray_pool`): ``rlzoo config check`` connects to nothing. :func:`adapter_problem`
says why the servers cannot load adapters on given targets: vLLM's own limits
(:func:`rlzoo.engines.vllm.lora.targets_problem`), and servers elsewhere (``servers``, or on a Ray cluster's nodes)
without a shared ``adapter_folder``.
"""

from __future__ import annotations

from importlib.util import find_spec

from rlzoo.engines.vllm import limits
from rlzoo.engines.vllm.lora import VLLM_LORA_RANKS, targets_problem
from rlzoo.engines.vllm_server.launcher import plugin_installed
from rlzoo.engines.vllm_server.options import LaunchParams, Params, RayParams
from rlzoo.engines.vllm_server.ray_pool import RAY_MISSING
from rlzoo.interfaces import Problem, RunFacts

INSTALL_HINT = (
    "rollout.engine.launch starts vLLM servers from this environment: install vLLM (CPU: `bash "
    "scripts/install_vllm_cpu.sh`; GPU: pip install 'rlzoo[vllm]'), then `pip install -e .` so vLLM finds "
    "rlzoo's gloo weight-transfer plugin"
)


def problems(params: Params, run: RunFacts, at: str, engine: str) -> list[Problem]:
    """Every problem of ``params`` (the engine's options at ``at``) for ``run``."""
    found: list[Problem] = []
    lora = run.config.model.lora
    if lora is not None and lora.sync != "merged" and lora.rank > VLLM_LORA_RANKS[-1]:
        found.append(
            (
                "model.lora.rank",
                f"{lora.rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}; use a lower rank or "
                "model.lora.sync: merged",
            )
        )
    return found + _source_problems(params, run, at, engine)


def adapter_problem(params: Params, targets: list[str]) -> str | None:
    """Why these servers cannot load LoRA adapters on ``targets``, or ``None``."""
    if params.launch is None and params.adapter_folder is None:
        where = "servers: servers started elsewhere" if params.servers is not None else "ray: servers on other nodes"
        return (
            f"rollout.engine.{where} do not read this machine's folders; set "
            "rollout.engine.adapter_folder to a folder every server reads at the same path (a shared filesystem)"
        )
    return targets_problem(targets)


def _source_problems(params: Params, run: RunFacts, at: str, engine: str) -> list[Problem]:
    sources = [name for name in ("launch", "servers", "ray") if getattr(params, name) is not None]
    if len(sources) != 1:
        return [(at, f"give exactly one of launch, servers or ray (got {', '.join(sources) or 'none'})")]
    if params.ray is not None:
        return _ray_problems(params.ray, run, f"{at}.ray", engine)
    if params.servers is not None:
        if not params.servers:
            return [(f"{at}.servers", "names no server")]
        return [
            (f"{at}.servers", f"{url!r} is not an http(s) URL")
            for url in params.servers
            if not url.startswith(("http://", "https://"))
        ]
    assert params.launch is not None  # exactly one source, and not the others
    return _launch_problems(params.launch, run, f"{at}.launch", engine)


def _launch_problems(launch: LaunchParams, run: RunFacts, at: str, engine: str) -> list[Problem]:
    found: list[Problem] = []
    if find_spec("vllm") is None:
        return [(at, INSTALL_HINT)]
    if not plugin_installed():
        found.append(
            (
                at,
                "vLLM does not find rlzoo's gloo weight-transfer plugin (entry point "
                "vllm.general_plugins): run `pip install -e .` in this environment",
            )
        )
    devices, tp = launch.devices, launch.tensor_parallel_size
    if devices is not None:
        if len(devices) != launch.count and launch.count != 1:
            found.append((f"{at}.devices", f"{len(devices)} entries for count {launch.count} servers"))
        for entry in devices:
            named = [d for d in entry.split(",") if d.strip()]
            if len(named) != tp:
                found.append(
                    (
                        f"{at}.tensor_parallel_size",
                        f"{tp} does not fit the devices {entry!r} "
                        f"({len(named)} named): each server shards over exactly its devices",
                    )
                )
    elif tp > 1 and not (run.device_memory or 0):
        found.append(
            (
                f"{at}.tensor_parallel_size",
                f"{tp}: tensor parallelism needs GPUs (name them in devices); use 1 on CPU",
            )
        )
    return found + limits.model_problems(launch, run, at, engine)


def _ray_problems(ray: RayParams, run: RunFacts, at: str, engine: str) -> list[Problem]:
    if find_spec("ray") is None:
        return [(at, RAY_MISSING)]
    found: list[Problem] = []
    if not ray.address.strip():
        found.append((f"{at}.address", "names no cluster: the head's host:port (`ray start --head --port PORT`)"))
    tp, gpus = ray.tensor_parallel_size, ray.num_gpus
    if gpus is not None and gpus not in (0, tp):
        found.append(
            (f"{at}.num_gpus", f"{gpus}: a server's GPUs are its tensor_parallel_size ({tp}) devices, or 0 (CPU)")
        )
    elif gpus == 0 and tp > 1:
        found.append((f"{at}.tensor_parallel_size", f"{tp}: tensor parallelism needs GPUs (num_gpus is 0); use 1"))
    return found + limits.model_problems(ray, run, at, engine)
