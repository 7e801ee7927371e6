"""Bad configs through the real CLI: ``config check`` and ``train`` reject each one alike, before anything starts.

A case must exit 1 with an ``error: invalid config`` message naming the field and the allowed values, no traceback,
and (``train``) no run folder: the preflight (:mod:`rlzoo.preflight.checks`) fails before the run builds anything.
Every case runs ``config check`` in-process through ``rlzoo.cli.main`` (fast: imports are done once). ``train`` runs
the very same preflight (:func:`test_train_runs_the_preflight_config_check_runs`), so it runs only the cases whose
inputs reach it by another way (the process count from the launcher's ``WORLD_SIZE``, ``--resume``, a run folder
already there, an engine package missing). Two cases also run as ``python -m rlzoo.cli`` subprocesses, one per
command: the exit path a user sees (each spends ~2.5 s of CPU importing torch, which plugin discovery needs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from folder_testlib import write_weights

COMMANDS = ("check", "train")
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# run the CLI module as __main__ with some packages made unimportable (find_spec returns None for them)
HIDING_MAIN = (
    "import runpy, sys; hidden, sys.argv = sys.argv[1].split(','), ['rlzoo', *sys.argv[2:]]; "
    "sys.modules.update(dict.fromkeys(hidden)); runpy.run_module('rlzoo.cli', run_name='__main__')"
)


@dataclass
class Case:
    """One bad config: ``config`` is merged over a small valid base; ``expect`` must all appear in stderr."""

    id: str
    config: dict = field(default_factory=dict)
    expect: tuple[str, ...] = ()
    setup: Callable[[Path], dict] | None = None  # writes files under its folder; returns more config
    args: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()  # packages that look uninstalled
    processes: int = 1  # train: WORLD_SIZE as a launcher sets it; config check: --processes


def hf_folder(
    root: Path, *, config: dict | None = None, tokenizer: bool = True, vocab: int = 5, weights: bool = True
) -> str:
    """A folder shaped like a Hugging Face model (the preflight reads files; nothing loads these weights)."""
    folder = root / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        tok = {"model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}}, "added_tokens": []}
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    if weights:  # the tensors config.json describes (zeros), or none where transformers cannot build it
        write_weights(folder) if config is not None else (folder / "model.safetensors").write_bytes(
            b"\x02\0\0\0\0\0\0\0{}"
        )
    return str(folder)


QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32, "vocab_size": 20}


DISTILL = {"algorithm": {"advantage": {"name": "reverse-kl"}}}  # an advantage that reads a teacher


def teacher_folder(root: Path, **kwargs) -> str:
    """An ``hf_folder`` of its own, for a teacher beside a model.path policy."""
    (root / "teacher").mkdir()
    return hf_folder(root / "teacher", **kwargs)


def data_file(root: Path, name: str = "train.jsonl") -> dict:
    (root / name).write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "1+2=", "answer": "3"}\n')
    return {}


def old_run(root: Path) -> dict:
    step = root / "out" / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "state.json").write_text('{"completed_steps": 2}')
    (step.parent / "latest").write_text(step.name)
    return {}


CASES = [
    Case(
        "head-dim-vllm",
        {"model": {"tiny": {"head_dim": 16}}, "rollout": {"engine": {"name": "vllm"}}},
        ("model.tiny.head_dim", "not supported by vLLM", "32, 64, 80"),
    ),
    Case("head-dim-odd", {"model": {"tiny": {"head_dim": 15}}}, ("model.tiny.head_dim", "even")),
    Case(
        "kv-cache-too-small",
        {"rollout": {"engine": {"name": "vllm", "kv_cache_memory_bytes": 10}}},
        (
            "rollout.engine.kv_cache_memory_bytes",
            "10 bytes cannot hold one sequence of the 256-token context",
            "use at least 131072",
        ),
    ),
    Case(
        "kv-heads",
        {"model": {"tiny": {"num_attention_heads": 4, "num_key_value_heads": 3}}},
        ("model.tiny.num_key_value_heads", "does not divide", "[1, 2, 4]"),
    ),
    Case(
        "top-k",
        {"model": {"tiny": {"num_experts": 4, "num_experts_per_tok": 6}}},
        ("model.tiny.num_experts_per_tok", "use 1..4"),
    ),
    Case(
        "hidden-zero", {"model": {"tiny": {"hidden_size": 0}}}, ("model.tiny.hidden_size", "greater than or equal to 1")
    ),
    Case("path-missing", {"model": {"path": "no/such/model"}}, ("model.path", "does not exist", "or null")),
    Case("path-no-config", setup=lambda d: {"model": {"path": hf_folder(d)}}, expect=("model.path", "no config.json")),
    Case(
        "path-no-tokenizer",
        setup=lambda d: {"model": {"path": hf_folder(d, config=QWEN3, tokenizer=False)}},
        expect=("model.path", "no tokenizer", "tokenizer.json"),
    ),
    Case(
        "path-no-weights",
        setup=lambda d: {"model": {"path": hf_folder(d, config=QWEN3, weights=False)}},
        expect=("model.path", "holds no weights", "*.safetensors"),
    ),
    Case(
        "vocab",
        setup=lambda d: {"model": {"path": hf_folder(d, config=QWEN3, vocab=40)}},
        expect=("model.path", "reach 39", "vocab_size is 20", "0..19"),
    ),
    Case(
        "path-head-dim-vllm",
        setup=lambda d: {"model": {"path": hf_folder(d, config={**QWEN3, "head_dim": 48})}},
        config={"rollout": {"engine": {"name": "vllm"}}},
        expect=("model.path", "head_dim 48", "32, 64"),
    ),
    Case("no-model", {"cold_start": {"enabled": False}}, ("cold_start.enabled", "true", "model.path")),
    Case(
        "minibatches",
        {"rollout": {"prompts_per_step": 3, "group_size": 2}, "algorithm": {"minibatches_per_rollout": 4}},
        ("algorithm.minibatches_per_rollout", "does not divide a step's 6 rows", "[1, 2, 3, 6]"),
    ),
    Case(
        "jsonl-missing",
        {"task": {"name": "jsonl", "path": "no/such.jsonl"}},
        ("task.path", "data file not found", "JSON-lines"),
    ),
    Case(
        "jsonl-eval-missing",
        setup=data_file,
        config={"task": {"name": "jsonl", "path": "train.jsonl", "eval_path": "eval.jsonl"}},
        expect=("task.eval_path", "data file not found"),
    ),
    Case(
        "jsonl-verifier",
        {"task": {"name": "jsonl", "path": "train.jsonl", "verifier": "nope"}},
        setup=data_file,
        expect=("verifier", "'nope'", "not installed", "exact"),
    ),
    Case(
        "vllm-missing",
        {"rollout": {"engine": {"name": "vllm"}}},
        ("rollout.engine.name", "'vllm'", "usable here: hf"),
        hide=("vllm",),
    ),
    Case(
        "deepspeed-missing",
        {"trainer": {"engine": {"name": "deepspeed"}}},
        ("trainer.engine.name", "'deepspeed'", "usable here: torch"),
        hide=("deepspeed",),
    ),
    Case(
        "router-dense",
        {"model": {"tiny": {"architecture": "qwen3"}}, "algorithm": {"router": {"name": "replay-old"}}},
        ("algorithm.router.name", "dense", "'none'", "model.tiny.architecture: qwen3_moe"),
    ),
    Case(
        "ds-moe-dense",
        {
            "model": {"tiny": {"architecture": "qwen3"}},
            "trainer": {"engine": {"name": "deepspeed", "moe": "deepspeed"}},
        },
        ("trainer.engine.moe", "dense", "use 'none'"),
    ),
    Case(
        "ds-moe-zero3",
        {"trainer": {"engine": {"name": "deepspeed", "moe": "deepspeed", "zero_stage": 3}}},
        ("trainer.engine.zero_stage", "use 0, 1 or 2"),
    ),
    Case(
        "ds-ep-size",
        {"trainer": {"engine": {"name": "deepspeed", "ep_size": 2}}},
        ("trainer.engine.ep_size", "needs moe: deepspeed", "use 1"),
    ),
    Case(
        "greedy-samples",
        {"train": {"eval_samples_per_prompt": 4, "eval_temperature": 0.0}},
        ("train.eval_samples_per_prompt", "use 1", "eval_temperature > 0"),
    ),
    Case(
        "vllm-context",
        {"rollout": {"engine": {"name": "vllm", "max_model_len": 512}}},
        ("rollout.engine.max_model_len", "max_position_embeddings 256", "at most 256"),
    ),
    Case("resume-missing", args=("--resume", "no/such/run"), expect=("--resume", "not a folder")),
    Case(
        "resume-empty",
        setup=lambda d: (d / "empty").mkdir() or {},
        args=("--resume", "empty"),
        expect=("--resume", "no complete checkpoint", "without --resume"),
    ),
    Case(
        "output-holds-run",
        setup=old_run,
        expect=("output_dir", "already holds a run", "--resume", "another output_dir"),
    ),
    Case(
        "launcher-vllm",
        {"rollout": {"engine": {"name": "vllm"}, "per_rank": False}},
        ("rollout.engine.name", "multi-process", "{name: hf}", "rollout.per_rank: true"),
        processes=2,
    ),
    Case(
        "launcher-rows",
        {"rollout": {"prompts_per_step": 1, "group_size": 2}, "algorithm": {"minibatches_per_rollout": 2}},
        ("algorithm.minibatches_per_rollout", "4 processes need at least 4 rows"),
        processes=4,
    ),
    Case(
        "gae-no-critic",
        {"algorithm": {"advantage": {"name": "gae"}}},
        ("algorithm.critic", "advantage 'gae'", "reads a critic's values", "preset: ppo", "group"),
    ),
    Case(
        "critic-no-returns",
        {"algorithm": {"critic": {}}},
        ("algorithm.critic", "advantage 'group' reads no values", "gae", "critic: null"),
    ),
    Case(
        "critic-dense-for-moe",
        setup=lambda d: {"algorithm": {"preset": "ppo", "critic": {"model": hf_folder(d, config=QWEN3)}}},
        expect=("algorithm.critic.model", "is a dense model but the policy is a mixture-of-experts one"),
    ),
    Case(
        "critic-missing",
        {"algorithm": {"preset": "ppo", "critic": {"model": "no/such/critic"}}},
        ("algorithm.critic.model", "does not exist", "null for a copy of the policy"),
    ),
    Case(
        "kl-controller-unknown",
        {"algorithm": {"kl_in_reward": {"name": "adaptiv"}}},
        ("algorithm.kl_in_reward.name", "did you mean 'adaptive'"),
    ),
    Case(
        "kl-in-reward-per-response",
        {"algorithm": {"kl_in_reward": {"name": "fixed"}}},
        ("algorithm.kl_in_reward", "advantage 'group'", "one reward per response", "gae", "algorithm.kl_coef"),
    ),
    Case("lora-rank", {"model": {"lora": {"rank": 0}}}, ("model.lora.rank", "greater than 0")),
    Case(
        "lora-targets",
        {"model": {"lora": {"target_modules": ["q_proj", "qkv"]}}},
        ("model.lora.target_modules", "['qkv']", "q_proj", "experts.gate_up_proj"),
    ),
    Case(
        "lora-dense-experts",
        {"model": {"tiny": {"architecture": "qwen3"}, "lora": {"target_modules": ["experts.down_proj"]}}},
        ("model.lora.target_modules", "['experts.down_proj']", "gate_proj"),
    ),
    Case(
        "lora-ds-moe-zero2",
        {"model": {"lora": {}}, "trainer": {"engine": {"name": "deepspeed", "moe": "deepspeed", "zero_stage": 2}}},
        ("trainer.engine.zero_stage", "needs trainable experts", "moe: none", "zero_stage 0"),
    ),
    Case(
        "lora-zero3",
        {"model": {"lora": {}}, "trainer": {"engine": {"name": "deepspeed", "zero_stage": 3}}},
        ("trainer.engine.zero_stage", "3 under model.lora is not supported", "use 0, 1 or 2"),
    ),
    Case(
        "lora-ds-moe-experts",
        {
            "model": {"lora": {"target_modules": ["q_proj", "experts.gate_up_proj"]}},
            "trainer": {"engine": {"name": "deepspeed", "moe": "deepspeed"}},
        },
        ("model.lora.target_modules", "DeepSpeed-MoE", "target attention only", "moe: none"),
    ),
    Case(
        "ep-size-world",
        {"trainer": {"engine": {"name": "deepspeed", "moe": "deepspeed", "ep_size": 2}}},
        ("trainer.engine.ep_size", "does not divide the 3 process(es)", "use one of [1, 3]"),
        processes=3,
    ),
    Case(
        "teacher-both", {"teacher": {"model": "t", "tiny": {}}, **DISTILL}, ("teacher", "exactly one of teacher.model")
    ),
    Case(
        "teacher-unread",
        {"teacher": {"tiny": {"hidden_size": 128}}},
        ("teacher", "advantage 'group'", "reads no teacher", "reverse-kl", "teacher: null"),
    ),
    Case(
        "distill-no-teacher", DISTILL, ("teacher", "null, but advantage 'reverse-kl'", "teacher's log-probs", "group")
    ),
    Case(
        "distill-nested-unknown",
        {"algorithm": {"advantage": {"name": "reverse-kl", "task": {"name": "gruop"}}}},
        ("algorithm.advantage.task.name", "did you mean 'group'"),
    ),
    Case(
        "distill-nested-gae",
        {"teacher": {"tiny": {}}, "algorithm": {"advantage": {"name": "reverse-kl", "task": {"name": "gae"}}}},
        ("algorithm.critic", "advantage 'gae' (algorithm.advantage.task)", "reads a critic's values"),
    ),
    Case(
        "teacher-missing",
        {"teacher": {"model": "no/such/teacher"}, **DISTILL},
        ("teacher.model", "does not exist", "teacher.tiny"),
    ),
    Case(
        "teacher-not-hf",
        setup=lambda d: {"teacher": {"model": teacher_folder(d)}, **DISTILL},
        expect=("teacher.model", "no config.json"),
    ),
    Case(
        "teacher-no-tokenizer",
        setup=lambda d: {"teacher": {"model": teacher_folder(d, config=QWEN3, tokenizer=False)}, **DISTILL},
        expect=("teacher.model", "has no tokenizer.json to compare with the policy's"),
    ),
    Case(
        "teacher-tokenizer",
        setup=lambda d: {"teacher": {"model": teacher_folder(d, config=QWEN3)}, **DISTILL},
        expect=(
            "teacher.model",
            "differs from the policy's (the task's character tokenizer",
            "22 tokens differ",
            "'*': absent in the teacher's, id 3 in the policy's",
            "built on the policy's tokenizer",
        ),
    ),
    Case(
        "teacher-tokenizer-ids",
        setup=lambda d: {
            "model": {"path": hf_folder(d, config=QWEN3, vocab=20)},
            **DISTILL,
            "teacher": {"model": teacher_folder(d, config={**QWEN3, "vocab_size": 10}, vocab=20)},
        },
        expect=("teacher.model", "reach 19", "vocab_size is 10", "does not belong to this model"),
    ),
    Case(
        "teacher-vocab-size",  # one tokenizer, but the policy's padded embedding lets it sample ids 20..23
        setup=lambda d: {
            "model": {"path": hf_folder(d, config={**QWEN3, "vocab_size": 24}, vocab=20)},
            **DISTILL,
            "teacher": {"model": teacher_folder(d, config=QWEN3, vocab=20)},
        },
        expect=("teacher.model", "has vocab_size 20 but the policy's is 24", "every id up to 23", "at least 24"),
    ),
    Case("teacher-tiny-shape", {"teacher": {"tiny": {"head_dim": 15}}, **DISTILL}, ("teacher.tiny.head_dim", "even")),
    Case(
        "teacher-tiny-tokenizer",
        setup=lambda d: {"model": {"path": hf_folder(d, config=QWEN3, vocab=20)}, "teacher": {"tiny": {}}, **DISTILL},
        expect=(
            "teacher.tiny",
            "the task's character tokenizer, which differs from the policy's (model.path)",
            "use teacher.model",
        ),
    ),
]
# train as well as config check: the cases whose inputs reach train's preflight by another way than check's
TRAIN_IDS = (
    "launcher-vllm",
    "launcher-rows",
    "ep-size-world",
    "resume-missing",
    "resume-empty",
    "output-holds-run",
    "vllm-missing",
)
IN_PROCESS = [(c, "check") for c in CASES] + [(c, "train") for c in CASES if c.id in TRAIN_IDS]
# a real subprocess costs seconds (torch's import): one per command, the exit path as a user sees it
SMOKES = (("check", "vllm-missing"), ("train", "output-holds-run"))
SUBPROCESS = [(c, command) for command, case_id in SMOKES for c in CASES if c.id == case_id]
BASE = {"output_dir": "out", "rollout": {"engine": {"name": "hf"}}, "trainer": {"engine": {"name": "torch"}}}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def prepare(case: Case, folder: Path) -> list[str]:
    """Write the case's files and ``run.yaml`` into ``folder``; return the CLI arguments after the command."""
    config = merge(BASE, case.config)
    if case.setup is not None:
        config = merge(config, case.setup(folder))
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    return ["run.yaml", *case.args]


def cli_args(case: Case, command: str) -> list[str]:
    if command == "train":
        return ["train"]
    return ["config", "check", *(["--processes", str(case.processes)] if case.processes > 1 else [])]


def launcher_env(case: Case, command: str) -> dict[str, str]:
    return {"WORLD_SIZE": str(case.processes)} if command == "train" and case.processes > 1 else {}


def run_case(case: Case, command: str, folder: Path) -> subprocess.CompletedProcess:
    argv = [*cli_args(case, command), *prepare(case, folder)]
    prefix = (
        [sys.executable, "-c", HIDING_MAIN, ",".join(case.hide)] if case.hide else [sys.executable, "-m", "rlzoo.cli"]
    )
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env.update(launcher_env(case, command))
    return subprocess.run([*prefix, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def assert_one_clear_error(case: Case, command: str, folder: Path, code: int, out: str, err: str) -> None:
    shown = f"stdout:\n{out}\nstderr:\n{err}"
    assert code == 1, shown
    assert "Traceback" not in out + err, shown
    assert out == "", shown
    assert err.startswith("error: invalid config"), shown
    for text in case.expect:
        assert text in err, f"{text!r} missing; {shown}"
    if command == "train":  # failed in the preflight: nothing built, no run folder
        assert not (folder / "out" / "config.yaml").exists()
        assert not (folder / "out" / "cold_start").exists()
        if case.id != "output-holds-run":
            assert not (folder / "out").exists(), shown


def test_enough_cases():
    assert len(CASES) >= 50 and len({c.id for c in CASES}) == len(CASES)
    assert {c.id for c, command in IN_PROCESS if command == "train"} == set(TRAIN_IDS)
    assert [command for _, command in SUBPROCESS] == list(COMMANDS)


def _ids(x):
    return getattr(x, "id", x)


@pytest.mark.parametrize("case, command", IN_PROCESS, ids=_ids)
def test_bad_config_in_process(tmp_path, monkeypatch, capsys, case: Case, command: str):
    """Every case through ``rlzoo.cli.main`` in this process (fast: the imports are done once)."""
    from rlzoo.cli import main

    argv = [*cli_args(case, command), *prepare(case, tmp_path)]
    monkeypatch.chdir(tmp_path)
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in launcher_env(case, command).items():
        monkeypatch.setenv(name, value)
    for name in case.hide:
        monkeypatch.setitem(sys.modules, name, None)
    code = main(argv)
    out, err = capsys.readouterr()
    assert_one_clear_error(case, command, tmp_path, code, out, err)


@pytest.fixture(scope="module")
def subprocess_results(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, subprocess.CompletedProcess]]:
    jobs = [(case, command, tmp_path_factory.mktemp(f"{case.id}-{command}")) for case, command in SUBPROCESS]
    with ThreadPoolExecutor(max_workers=3) as pool:  # each spends its seconds importing torch
        procs = list(pool.map(lambda job: run_case(*job), jobs))
    return {(case.id, command): (folder, proc) for (case, command, folder), proc in zip(jobs, procs)}


@pytest.mark.parametrize("case, command", SUBPROCESS, ids=_ids)
def test_bad_config_through_the_real_cli(subprocess_results, case: Case, command: str):
    """The same, as ``python -m rlzoo.cli`` subprocesses: what a user sees, start-up included."""
    folder, proc = subprocess_results[(case.id, command)]
    assert_one_clear_error(case, command, folder, proc.returncode, proc.stdout, proc.stderr)


def test_train_runs_the_preflight_config_check_runs(tmp_path, monkeypatch, capsys):
    """``train`` refuses what ``config check`` refuses because it calls the same :func:`preflight`, before it writes
    anything, with the config it resolved, the registry, the launcher's process count and its ``--resume`` and
    ``--allow-changes``: so the tables check each rule once, through ``config check``."""
    from rlzoo.cli import main
    from rlzoo.errors import ConfigError
    from rlzoo.preflight import checks

    calls = []

    def refusing(config, registry, **kwargs):
        calls.append((config, kwargs))
        raise ConfigError([("trainer.lr", "refused by the preflight (a test's stand-in)")])

    monkeypatch.setattr(checks, "preflight", refusing)
    prepare(Case("base"), tmp_path)
    monkeypatch.chdir(tmp_path)
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    for argv in (["config", "check", "run.yaml", "--processes", "3"], ["train", "run.yaml", "--set", "seed=7"]):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: invalid config") and "trainer.lr: refused by the preflight" in err
    (_, check), (config, train) = calls
    assert config.seed == 7 and config.output_dir == "out"
    assert train["world"] == check["world"] == 3 and train["resume"] is check["resume"] is None
    assert train["allow_changes"] == check["allow_changes"] == []
    assert not (tmp_path / "out").exists()  # refused before the run wrote anything


def test_the_base_config_passes_the_check(tmp_path, monkeypatch, capsys):
    """The cases fail because of what each adds: the base alone checks clean."""
    from rlzoo.cli import main

    prepare(Case("base"), tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "check", "run.yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rollout"]["engine"]["name"] == "hf"


# -- the preflight on good configs, and the rules it shares --------------------------------------------------


def _preflight(data: dict, **kwargs) -> None:
    from rlzoo.config.resolution import build_config
    from rlzoo.preflight.checks import preflight
    from rlzoo.registry import default_registry

    preflight(build_config(data), default_registry(), **kwargs)


def test_a_complete_model_folder_passes(tmp_path):
    path = hf_folder(tmp_path, config=QWEN3, vocab=20)
    _preflight(merge(BASE, {"output_dir": str(tmp_path / "out"), "model": {"path": path}}))


def test_a_teacher_on_the_policys_tokenizer_passes(tmp_path):
    path = hf_folder(tmp_path, config=QWEN3, vocab=20)
    teacher = teacher_folder(tmp_path, config={**QWEN3, "vocab_size": 24}, vocab=20)  # a padded embedding is fine
    _preflight(
        merge(
            BASE,
            {"output_dir": str(tmp_path / "out"), "model": {"path": path}, "teacher": {"model": teacher}, **DISTILL},
        )
    )
    _preflight(merge(BASE, {"output_dir": str(tmp_path / "out"), "teacher": {"tiny": {"hidden_size": 128}}, **DISTILL}))


@pytest.mark.parametrize("experts, ok", [(8, True), (None, False)])
def test_router_replay_reads_moe_from_the_model_folder(tmp_path, experts, ok):
    from rlzoo.errors import ConfigError

    hf = {**QWEN3, "model_type": "qwen3_moe", "num_experts": experts} if experts else QWEN3
    data = merge(
        BASE,
        {
            "output_dir": str(tmp_path / "out"),
            "model": {"path": hf_folder(tmp_path, config=hf, vocab=20)},
            "algorithm": {"router": {"name": "replay-old"}},
        },
    )
    if ok:
        _preflight(data)
    else:
        with pytest.raises(ConfigError, match="algorithm.router.name"):
            _preflight(data)


def test_resuming_a_run_with_a_checkpoint_passes(tmp_path):
    old_run(tmp_path)
    run = tmp_path / "out"
    _preflight(merge(BASE, {"output_dir": str(run)}), resume=run)


def test_the_data_parallel_rule_counts_processes():
    from rlzoo.config.resolution import build_config
    from rlzoo.preflight.batches import data_parallel_problem

    config = build_config(
        {"rollout": {"prompts_per_step": 2, "group_size": 2}, "algorithm": {"minibatches_per_rollout": 2}}
    )
    assert data_parallel_problem(config, 2) is None  # 2 rows per minibatch: one each
    assert "3 processes need at least 3 rows" in data_parallel_problem(config, 3)
    assert data_parallel_problem(config, 2, prompts=1) is not None  # a task with one train prompt


def test_tiny_model_shapes_are_one_rule_for_the_builder_and_the_preflight():
    """tiny.py refuses what the preflight refuses (the engine-independent rules), and vLLM's head sizes only bind
    with the vllm engine: transformers runs head_dim 16."""
    import torch

    from rlzoo.config.schema import TinyModelConfig
    from rlzoo.errors import ConfigError
    from rlzoo.models import build_char_tokenizer, build_tiny_model, tiny_model_config

    tokenizer = build_char_tokenizer("0123456789+=")
    bad = TinyModelConfig(num_attention_heads=4, num_key_value_heads=3)
    assert [f for f, _ in bad.shape_problems()] == ["num_key_value_heads"]
    with pytest.raises(ConfigError, match="model.tiny.num_key_value_heads"):
        tiny_model_config(bad, tokenizer)
    small = TinyModelConfig(head_dim=16)
    assert small.shape_problems() == []  # vLLM's head sizes are the vllm engine's own check (case head-dim-vllm)
    model = build_tiny_model(small, tokenizer)
    logits = model(torch.tensor([tokenizer("1+2=")["input_ids"]])).logits
    assert logits.shape[-1] == len(tokenizer) and torch.isfinite(logits).all()


def test_a_response_longer_than_the_context_is_refused_with_any_rollout_engine(tmp_path):
    from rlzoo.config.resolution import build_config
    from rlzoo.errors import ConfigError
    from rlzoo.preflight.checks import preflight
    from rlzoo.registry import default_registry

    registry = default_registry()
    config = build_config({"output_dir": str(tmp_path / "run"), "rollout": {"max_new_tokens": 300}}, registry=registry)
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)  # the hf engine, the tiny model's 256 positions
    assert [field for field, _ in err.value.problems] == ["rollout.max_new_tokens"]
    assert "256-token context" in str(err.value)
