"""The fault table's model files, through the real CLI: damaged weights of the models a run reads besides its
checkpoints (the policy's ``model.path``, ``algorithm.critic.model``, ``teacher.model``, a reward model's
``verifier.path``), and ``rlzoo export``'s inputs (the adapters, verified against the checkpoint's digests as
``--resume`` verifies them, and the base model).

Each case runs ``rlzoo ...`` through the CLI's entry function in this process (tests/cli_testlib.py) and is held to
:mod:`test_fault_table`'s rules (its exit code, no traceback, the field or the file named, one ``error:`` line). The
cases start from one finished tiny LoRA run (two checkpoints, and its cold start as the model folder to damage),
made once, beside a base model of other sizes, a deeper one and a small reward model.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import test_fault_table as table
from cli_testlib import run_cli
from test_fault_table import TEMPLATE, Case, Context, checkpoint_file, config, copied_run, flip, merge, truncate

ALPHABET = "0123456789+-*="  # the arithmetic task's: the models below share the run's character tokenizer


def make_lora_template(folder: Path) -> Path:
    """A finished two-step LoRA run in ``folder/run`` (adapter checkpoints after steps 1 and 2; its base, the cold
    start, in ``folder/cold``), and beside it ``other`` (hidden size 32, not 64), ``deeper`` (3 layers, not 2) and
    ``rm`` (a one-label sequence-classification model), all on the run's tokenizer."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from rlzoo.config.schema import TinyModelConfig
    from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

    lora = {"cold_start": {"output_dir": str(folder / "cold")}, "model": {"lora": {"rank": 4}}}
    config(folder, merge(TEMPLATE, lora))
    proc = run_cli(["train", "run.yaml"], folder, table._environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokenizer = build_char_tokenizer(ALPHABET)
    save_model(build_tiny_model(TinyModelConfig(hidden_size=32, head_dim=16), tokenizer), tokenizer, folder / "other")
    save_model(build_tiny_model(TinyModelConfig(num_hidden_layers=3), tokenizer), tokenizer, folder / "deeper")
    reward = Qwen3ForSequenceClassification(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=1,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    save_model(reward, tokenizer, folder / "rm")
    return folder


def damaged_model(source: str, name: str, extra: Callable[[str], dict], command: str = "check"):
    """``source`` (``cold``: the run's base, or ``rm``) copied to ``name`` with its weights cut in half, and a config
    that names it (``extra(name)``)."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        shutil.copytree(ctx.template / source, folder / name)
        truncate(folder / name / "model.safetensors")
        cold = {"cold_start": {"output_dir": str(ctx.template / "cold")}}
        return [*(["config", "check"] if command == "check" else [command]), config(folder, merge(cold, extra(name)))]

    return setup


def export(step: int, *damage: tuple[str, Callable[[Path], None]], base: str | None = None, plain: bool = False):
    """``rlzoo export`` of a copy of the run's checkpoint ``step`` (``plain``: its ``model/`` folder alone, copied to
    ``adapters``, no digests beside it) into ``merged``, each ``(file, how)`` of ``damage`` done to a file of its
    ``model/`` first; ``base``: a folder beside the run (``--base``), a damaged copy of the run's base with
    ``"damaged"``."""

    def setup(folder: Path, ctx: Context) -> list[str]:
        run = copied_run(folder, ctx)
        source = checkpoint_file(run, step, "model")
        if plain:
            source = shutil.copytree(source, folder / "adapters")
        for name, how in damage:
            how(source / name)
        flags = []
        if base == "damaged":
            truncate(shutil.copytree(ctx.template / "cold", folder / "base") / "model.safetensors")
            flags = ["--base", "base"]
        elif base is not None:
            flags = ["--base", str(ctx.template / base)]
        return [
            "export",
            str(source.relative_to(folder) if plain else source.parent.relative_to(folder)),
            "merged",
            *flags,
        ]

    return setup


def trained(path: Path) -> None:
    """Every ``lora_B`` drawn at random (seeded): adapters that change the model, as trained ones do (the tiny run's
    rewards are 0, so its own ``B`` stay 0)."""
    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(0)
    tensors = load_file(str(path))
    save_file(
        {k: torch.randn(v.shape, generator=generator) if ".lora_B." in k else v for k, v in tensors.items()}, str(path)
    )


CRITIC = {"algorithm": {"advantage": {"name": "gae"}, "critic": {"model": "critic"}}}
TEACHER = {"algorithm": {"advantage": {"name": "reverse-kl"}}, "teacher": {"model": "teacher"}}
REWARD_MODEL = {"verifier": {"name": "reward-model", "path": "rm"}}
TRUNCATED = "is damaged: truncated ("
ADAPTER = "adapter_model.safetensors"

CASES = [
    # damaged weights of a model the run reads: refused by the preflight (config check; train runs the same one before
    # it starts: tests/test_bad_configs.py)
    Case(
        "critic-weights-truncated-check",
        damaged_model("cold", "critic", lambda n: CRITIC),
        (f"algorithm.critic.model: critic/model.safetensors {TRUNCATED}", "copy or save the model again"),
    ),
    Case(
        "teacher-weights-truncated-check",
        damaged_model("cold", "teacher", lambda n: TEACHER),
        (f"teacher.model: teacher/model.safetensors {TRUNCATED}",),
    ),
    Case(
        "reward-model-weights-truncated-check",
        damaged_model("rm", "rm", lambda n: REWARD_MODEL),
        (f"verifier.path: rm/model.safetensors {TRUNCATED}",),
    ),
    Case(
        "policy-weights-truncated-check",
        damaged_model("cold", "policy", lambda n: {"model": {"path": n}}),
        (f"model.path: policy/model.safetensors {TRUNCATED}",),
    ),
    # rlzoo export: the adapters verified against digests.json, as --resume verifies a checkpoint
    Case(
        "export-adapter-flipped",
        export(2, (ADAPTER, flip)),
        (
            "error: export: checkpoint run/checkpoints/step_000002 is damaged (model/adapter_model.safetensors: content "
            "differs from its recorded sha256 digest)",
            "export an earlier checkpoint",
        ),
    ),
    Case(
        "export-adapter-truncated",
        export(1, (ADAPTER, truncate)),
        (
            "error: export: checkpoint run/checkpoints/step_000001 is damaged (model/adapter_model.safetensors: "
            "truncated (",
        ),
        absent=("SafetensorError",),
    ),
    Case(
        "export-adapter-truncated-without-digests",
        export(2, (ADAPTER, truncate), plain=True),
        (f"error: export: adapters/{ADAPTER} {TRUNCATED}",),
        absent=("SafetensorError",),
    ),
    Case(
        "export-adapter-config-damaged",
        export(2, ("adapter_config.json", truncate), plain=True),
        ("error: export: adapters/adapter_config.json is not readable JSON",),
    ),
    # rlzoo export: the base
    Case(
        "export-base-of-another-shape",
        export(2, base="other"),
        (
            "does not fit the adapters in run/checkpoints/step_000002/model/adapter_model.safetensors",
            "16 of 16 adapter tensors have another shape than this base needs",
            ".lora_A.weight is [4, 64] in the adapters and [4, 32] for this base",
        ),
        absent=("size mismatch",),
    ),
    Case(
        "export-base-deeper",
        export(2, base="deeper"),
        ("this base has 8 adapted weights the adapters hold nothing for, e.g. base_model.model.model.layers.2.",),
    ),
    Case(
        "export-base-truncated",
        export(2, base="damaged"),
        (f"error: export: --base base: base/model.safetensors {TRUNCATED}",),
    ),
    Case("export-intact", export(2), ("merged",), code=0, one_error=False),
    Case(
        "export-adapters-of-a-plain-folder",
        export(2, (ADAPTER, trained), plain=True),
        ("merged",),
        code=0,
        one_error=False,
    ),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return make_lora_template(tmp_path_factory.mktemp("lora-template"))


@pytest.fixture(scope="module")
def results(template, tmp_path_factory) -> dict[str, tuple[Path, table.Outcome]]:
    ctx = Context(template)
    jobs = [(case, tmp_path_factory.mktemp(case.id)) for case in CASES]
    procs = table.run_cases(jobs, ctx)
    yield {case.id: (folder, proc) for (case, folder), proc in zip(jobs, procs)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_damaged_model_files_through_the_real_cli(results, case: Case):
    table.test_bad_input_through_the_real_cli(results, case)  # the fault table's own rules for every case
    folder, _ = results[case.id]
    if case.id.startswith("export-"):  # refused before anything is written; the intact one writes a whole folder
        merged = folder / "merged"
        assert (merged / "model.safetensors").is_file() if case.code == 0 else not merged.exists()
        assert not list(folder.glob(".merged.tmp-*"))


def test_the_exported_model_is_the_base_plus_the_adapters(results, template):
    """The export holds W + (alpha / r) B A for every adapted weight and the base's other weights unchanged: the
    checks in front of the merge leave it exact."""
    import json

    import torch
    from safetensors.torch import load_file

    folder, _ = results["export-adapters-of-a-plain-folder"]
    merged = load_file(str(folder / "merged" / "model.safetensors"))
    base = load_file(str(template / "cold" / "model.safetensors"))
    lora = load_file(str(folder / "adapters" / ADAPTER))
    settings = json.loads((folder / "adapters" / "adapter_config.json").read_text())
    scale = settings["lora_alpha"] / settings["r"]
    assert merged.keys() == base.keys()
    adapted = 0
    for name, weight in base.items():
        prefix = "base_model.model." + name.removesuffix(".weight")
        if f"{prefix}.lora_A.weight" in lora:
            delta = scale * lora[f"{prefix}.lora_B.weight"] @ lora[f"{prefix}.lora_A.weight"]
            assert delta.abs().max() > 0.01, name
            torch.testing.assert_close(merged[name], weight + delta)
            adapted += 1
        else:
            assert torch.equal(merged[name], weight), name
    assert adapted == len(lora) // 2 == 8
