"""The vllm-server engine's start-up check and its pure parts, without a server: one source of servers, ray refused
as not implemented, tensor parallelism that fits the named devices, the features it does not have refused before
the run by field (adapter sync to servers elsewhere without a shared folder), the command line a launched server
runs (with LoRA), and one gloo broadcast reaching two processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from rlzoo.config.resolution import build_config
from rlzoo.engines.vllm_server import gloo_group
from rlzoo.engines.vllm_server.options import LaunchParams, server_arguments
from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry


def problems(tmp_path: Path, engine: dict, **sections) -> list[tuple[str, str]]:
    registry = default_registry()
    config = build_config(
        {
            "output_dir": str(tmp_path / "run"),
            "rollout": {"engine": {"name": "vllm-server", **engine}, **sections.pop("rollout", {})},
            **sections,
        },
        registry=registry,
    )
    try:
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
        ({"ray": {"address": "auto"}}, "rollout.engine.ray", "not implemented yet"),
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
        ({"rollout": {"partial": "continue", "max_staleness": 1}}, "rollout.partial"),
        ({"model": {"lora": {"rank": 1024, "sync": "adapter"}}}, "model.lora.rank"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_before_the_run(tmp_path, sections, field):
    found = problems(tmp_path, {"servers": ["http://127.0.0.1:8000"], "adapter_folder": "/shared"}, **sections)
    assert field in fields(found), found


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


def test_ray_is_refused_at_start_too():
    engine = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(ray={}))
    with pytest.raises(RlzooError, match="rollout.engine.ray: .*not implemented yet"):
        engine.start(None)


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
