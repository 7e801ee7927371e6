"""Verified checkpoints: every file's digest is recorded, ``--resume`` checks them before loading anything, a
damaged latest checkpoint is reported file by file and the run resumes from the newest intact earlier one.

One real tiny run (transformers rollouts, torch training, a checkpoint after every step, three kept) is made once;
every file of its latest checkpoint is then truncated, or has 256 bytes flipped inside its content, and verified and
loaded in process (:func:`rlzoo.runtime.checkpoint.resume.choose_checkpoint`, :func:`rlzoo.runtime.checkpoint.store.load_checkpoint`). Three
cases go through the real CLI: a damaged latest checkpoint (falls back, and the metrics equal the undamaged run's),
every checkpoint damaged (refused, each listed), and checkpoints written before digests (loaded with a warning).
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml
from cli_testlib import CliResult, run_cli
from safetensors.torch import load_file

from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.checkpoint.digests import MANIFEST, verify_checkpoint
from rlzoo.runtime.checkpoint.files import CheckpointLoadError, checkpoint_candidates
from rlzoo.runtime.checkpoint.resume import CheckpointDamaged, choose_checkpoint
from rlzoo.runtime.checkpoint.store import load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
STEPS = 3
TINY = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "algorithm.reward_shaping=[{name: length, coef: 0.1}]",  # rewards differ within a group: the weights move
    f"train.steps={STEPS}",
    "train.eval_every=2",
    "train.eval_prompts=4",
    "train.eval_samples_per_prompt=1",
    "train.checkpoint_every=1",
    "train.keep_checkpoints=3",
]
# every file the torch engine's checkpoint holds: a new one fails this test until its damage is tested too
FILES = [
    MANIFEST,
    "model/config.json",
    "model/generation_config.json",
    "model/model.safetensors",
    "model/tokenizer.json",
    "model/tokenizer_config.json",
    "optimizer.json",
    "optimizer.safetensors",
    "rng.json",
    "rng.safetensors",
    "state.json",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """``(config file, run folder)`` of an undamaged run of STEPS steps, through the CLI."""
    root = tmp_path_factory.mktemp("integrity")
    config = root / "run.yaml"
    data = apply_overrides(read_yaml(EXAMPLE), [*TINY, f"cold_start.output_dir={root / 'cold'}"])
    config.write_text(yaml.safe_dump(data))
    run_dir = root / "reference"
    proc = run_cli(["train", str(config), "--set", f"output_dir={run_dir}"], root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "latest",
        "step_000001",
        "step_000002",
        "step_000003",
    ]
    return config, run_dir


def copy_run(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


# -- damage -----------------------------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def flip(path: Path, count: int = 256) -> None:
    """Flip ``count`` bytes inside the content: a safetensors file's tensor data (after its header), or the middle
    of a JSON file (its low bits: the text often still parses, only the digest tells)."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".safetensors":
        start = 8 + struct.unpack("<Q", data[:8])[0]
        mask = 0xFF
    else:
        start = 0
        mask = 0x01
    count = min(count, len(data) - start)
    start += (len(data) - start - count) // 2
    for i in range(start, start + count):
        data[i] ^= mask
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": truncate, "flipped": flip}


def problems_of(path: Path) -> list[str]:
    return verify_checkpoint(path).problems


# -- in process: every file of the latest checkpoint, each damage --------------------------------------------------


def test_every_checkpoint_records_the_digest_of_each_file(reference):
    _, run_dir = reference
    for step in (1, 2, 3):
        manifest = json.loads((checkpoint(run_dir, step) / MANIFEST).read_text())
        assert sorted(manifest["files"]) == sorted(f for f in FILES if f != MANIFEST)
        assert all(len(e["sha256"]) == 64 and e["size"] > 0 for e in manifest["files"].values())
        check = verify_checkpoint(checkpoint(run_dir, step))
        assert check.intact and check.verified, check


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_file_of_the_latest_checkpoint_is_named_and_the_previous_one_loads(
    reference, tmp_path, caplog, name, damage
):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    DAMAGE[damage](checkpoint(run_dir, 3) / name)

    problems = problems_of(checkpoint(run_dir, 3))
    expected = {"truncated": "truncated", "flipped": "content differs"}[damage] if name != MANIFEST else "damaged"
    assert [p for p in problems if p.startswith(f"{name}: ")] == problems, problems  # the damaged file, alone
    assert len(problems) == 1 and expected in problems[0], problems

    with caplog.at_level(logging.WARNING, logger="rlzoo"):
        chosen = choose_checkpoint(run_dir)
    assert chosen == checkpoint(run_dir, 2)
    [record] = [r for r in caplog.records if r.name == "rlzoo.runtime.checkpoint.resume"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert f"{checkpoint(run_dir, 3)} is damaged ({name}: " in message, message
    assert f"resuming from {checkpoint(run_dir, 2)}, the newest intact checkpoint, so step 2 is run again" in message

    # the checkpoint chosen loads: weights, optimizer state, RNG and state as written
    engine = _torch_engine(chosen / "model")
    state = load_checkpoint(chosen, engine)
    assert state == {"completed_steps": 2}
    saved = load_file(str(chosen / "model" / "model.safetensors"))
    live = dict(engine.named_weights())
    assert all(torch.equal(live[k], v) for k, v in saved.items())


def _torch_engine(model_dir: Path):
    from transformers import AutoTokenizer

    from rlzoo.engines import EngineContext
    from rlzoo.engines.torch_trainer import TorchTrainingEngine

    config = build_config(read_yaml(EXAMPLE), TINY)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = TorchTrainingEngine()
    context = EngineContext(model_dir, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    engine.start(context, config.trainer)
    return engine


def test_a_missing_file_or_folder_and_an_added_file_are_problems_too(reference, tmp_path):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    (checkpoint(run_dir, 3) / "optimizer.safetensors").unlink()
    (checkpoint(run_dir, 3) / "model" / "extra.safetensors").write_bytes(b"\0" * 8)
    assert problems_of(checkpoint(run_dir, 3)) == [
        "optimizer.safetensors: missing",
        f"model/extra.safetensors: not written with the checkpoint (not in {MANIFEST})",
    ]
    shutil.rmtree(checkpoint(run_dir, 2))  # `latest` names step 3; step 2 is gone: step 1 is the newest intact
    assert checkpoint_candidates(run_dir) == [checkpoint(run_dir, 3), checkpoint(run_dir, 1)]
    assert choose_checkpoint(run_dir) == checkpoint(run_dir, 1)
    shutil.rmtree(checkpoint(run_dir, 3))
    assert problems_of(checkpoint(run_dir, 3)) == ["the folder is missing"]
    assert choose_checkpoint(run_dir) == checkpoint(run_dir, 1)


def test_a_damaged_latest_pointer_falls_back_to_the_checkpoint_folders(reference, tmp_path):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    (run_dir / "checkpoints" / "latest").write_bytes(b"\xfftep_0000\x03")
    assert choose_checkpoint(run_dir) == checkpoint(run_dir, 3)
    (run_dir / "checkpoints" / "latest").unlink()  # never pointed anywhere: no checkpoint was completed
    with pytest.raises(CheckpointDamaged, match="no complete checkpoint found"):
        choose_checkpoint(run_dir)


def test_no_intact_checkpoint_is_refused_listing_each(reference, tmp_path):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    flip(checkpoint(run_dir, 3) / "rng.safetensors")
    (checkpoint(run_dir, 2) / "state.json").unlink()
    truncate(checkpoint(run_dir, 1) / "optimizer.safetensors")
    with pytest.raises(CheckpointDamaged) as err:
        choose_checkpoint(run_dir)
    lines = str(err.value).splitlines()
    assert (
        lines[0] == f"no intact checkpoint to resume in {run_dir / 'checkpoints'}; every one is damaged or incomplete:"
    )
    assert lines[1] == "  step_000003: rng.safetensors: content differs from its recorded sha256 digest"
    assert lines[2] == "  step_000002: state.json: missing"
    assert lines[3].startswith("  step_000001: optimizer.safetensors: truncated (")
    assert lines[4] == "restore the files from a copy, or start a new run without --resume"


# -- checkpoints written before digests were recorded --------------------------------------------------------------


def _legacy(run_dir: Path) -> None:
    for step in (1, 2, 3):
        (checkpoint(run_dir, step) / MANIFEST).unlink()


def test_a_checkpoint_without_digests_is_checked_for_structure_and_loaded_with_a_warning(reference, tmp_path, caplog):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    _legacy(run_dir)
    check = verify_checkpoint(checkpoint(run_dir, 3))
    assert check.intact and not check.verified
    with caplog.at_level(logging.WARNING, logger="rlzoo"):
        assert choose_checkpoint(run_dir) == checkpoint(run_dir, 3)
    assert any(
        "has no digests.json" in r.getMessage() and "cannot be verified" in r.getMessage() for r in caplog.records
    )

    flip(checkpoint(run_dir, 3) / "model" / "model.safetensors")  # without digests: not detectable (documented)
    assert verify_checkpoint(checkpoint(run_dir, 3)).intact
    truncate(checkpoint(run_dir, 3) / "model" / "model.safetensors")  # a truncated file is, from its header
    truncate(checkpoint(run_dir, 3) / "rng.json")
    problems = problems_of(checkpoint(run_dir, 3))
    assert problems[0].startswith("model/model.safetensors: truncated (") and problems[1:] == [
        "rng.json: damaged (not valid JSON)"
    ], problems
    assert choose_checkpoint(run_dir) == checkpoint(run_dir, 2)


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("state.json", "{}", "state.json holds no completed_steps"),
        ("rng.json", '{"pyth', "rng.json: JSONDecodeError"),
        ("optimizer.json", '{"param_groups": []}', "optimizer.json"),
        ("rng.safetensors", "not safetensors", "rng.safetensors: "),
    ],
)
def test_a_load_that_fails_anyway_names_the_file(reference, tmp_path, name, content, says):
    _, source = reference
    run_dir = tmp_path / "run"
    shutil.copytree(source / "checkpoints", run_dir / "checkpoints")
    (checkpoint(run_dir, 3) / name).write_text(content)
    engine = _torch_engine(checkpoint(run_dir, 3) / "model")
    with pytest.raises(CheckpointLoadError) as err:
        load_checkpoint(checkpoint(run_dir, 3), engine)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


# -- writing ---------------------------------------------------------------------------------------------------


class _Trainer:
    def save(self, directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "model" / "weights.json").write_text("[1, 2, 3]")


class _Tokenizer:
    def save_pretrained(self, directory: Path) -> None:
        Path(directory, "tokenizer.json").write_text("{}")


def test_the_digests_are_written_last_and_newer_checkpoints_of_an_abandoned_run_are_dropped(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, _Trainer(), _Tokenizer(), keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    listed = json.loads((root / "step_000003" / MANIFEST).read_text())["files"]
    assert sorted(listed) == ["model/tokenizer.json", "model/weights.json", "rng.json", "rng.safetensors", "state.json"]
    # resumed from step 2 (step 3 damaged): writing step 3 again replaces it; a later one would be dropped
    (root / "step_000004").mkdir()
    save_checkpoint(tmp_path, 3, _Trainer(), _Tokenizer(), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert verify_checkpoint(root / "step_000003").intact


# -- the real CLI -----------------------------------------------------------------------------------------------


def _resume(config: Path, run_dir: Path) -> CliResult:
    return run_cli(["train", str(config), "--resume", str(run_dir)], run_dir.parent)


def _metrics(run_dir: Path) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [json.loads(json.dumps({k: v for k, v in r.items() if not k.startswith("time/")})) for r in rows]


def test_cli_resume_falls_back_past_a_damaged_latest_checkpoint_and_reproduces_the_run(reference, tmp_path):
    config, source = reference
    run_dir = copy_run(source, tmp_path / "run")
    flip(checkpoint(run_dir, 3) / "model" / "model.safetensors")
    proc = _resume(config, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [warning] = [line for line in proc.stderr.splitlines() if "is damaged" in line]
    assert "model/model.safetensors: content differs from its recorded sha256 digest" in warning, warning
    assert f"resuming from {checkpoint(run_dir, 2)}, the newest intact checkpoint, so step 2 is run again" in warning
    assert _metrics(run_dir) == _metrics(source)  # resumed from step 2: exactly the undamaged run
    assert [r["step"] for r in _metrics(run_dir)] == list(range(STEPS + 1))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"  # written again, intact
    assert verify_checkpoint(checkpoint(run_dir, 3)).intact


def test_cli_resume_with_every_checkpoint_damaged_is_refused(reference, tmp_path):
    config, source = reference
    run_dir = copy_run(source, tmp_path / "run")
    truncate(checkpoint(run_dir, 3) / "model" / "model.safetensors")
    flip(checkpoint(run_dir, 2) / "optimizer.json")
    (checkpoint(run_dir, 1) / "rng.safetensors").unlink()
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    proc = _resume(config, run_dir)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    err = proc.stderr[proc.stderr.index("error: ") :]
    assert err.startswith(f"error: no intact checkpoint to resume in {run_dir / 'checkpoints'}"), err
    assert "  step_000003: model/model.safetensors: truncated (" in err, err
    assert "  step_000002: optimizer.json: content differs from its recorded sha256 digest" in err, err
    assert "  step_000001: rng.safetensors: missing" in err, err
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics  # nothing was touched
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"


def test_cli_resume_of_checkpoints_written_before_digests_warns_and_reproduces_the_run(reference, tmp_path):
    config, source = reference
    run_dir = copy_run(source, tmp_path / "run")
    _legacy(run_dir)
    truncate(checkpoint(run_dir, 3) / "optimizer.safetensors")  # still found: its header says how long it was
    proc = _resume(config, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "optimizer.safetensors: truncated (" in proc.stderr and "so step 2 is run again" in proc.stderr
    assert f"checkpoint {checkpoint(run_dir, 2)} has no digests.json" in proc.stderr, proc.stderr[-3000:]
    assert "cannot be verified" in proc.stderr
    assert _metrics(run_dir) == _metrics(source)
    assert verify_checkpoint(checkpoint(run_dir, 3)).verified  # the new checkpoints record their digests
