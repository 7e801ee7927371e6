"""Numbers in a config that ran, but not as written (issue 52): a boolean where a number is meant, a float beyond
float32, a gdpo weight naming a part the verifier does not return. Each ``rlzoo config check`` (in-process) exits 1
with one ``error:`` naming the field; YAML integers and ``--set key=3`` still pass. The rule itself:
:mod:`rlzoo.util.strict_numbers`, held by every config section and every component's ``Params``."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from rlzoo.cli import main

BASE = {"output_dir": "out", "rollout": {"engine": {"name": "hf"}}, "trainer": {"engine": {"name": "torch"}}}
WEIGHTED = (
    "verifier={name: weighted, verifiers: [{name: exact, label: correct}, {name: regex, pattern: x, label: format}]}"
)


def check(tmp_path, monkeypatch, capsys, *sets: str, extra: dict | None = None) -> tuple[int, str]:
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**BASE, **(extra or {})}))
    monkeypatch.chdir(tmp_path)
    code = main(["config", "check", "run.yaml", *(item for s in sets for item in ("--set", s))])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["rollout.max_staleness=true"], "rollout.max_staleness: true is a boolean, not a number"),
        (["rollout.group_size=true"], "rollout.group_size: true is a boolean, not a number"),
        (["train.eval_every=5.0"], "train.eval_every: Input should be a valid integer"),
        (["algorithm.kl_coef=true"], "algorithm.kl_coef: true is a boolean, not a number"),
        (["algorithm.kl_coef=1e+308"], "algorithm.kl_coef: 1e+308 does not fit in float32"),
        (["trainer.lr=1.0e+39"], "trainer.lr: 1e+39 does not fit in float32"),
        (["train.verifier_timeout_s=1.0e+300"], "train.verifier_timeout_s: 1e+300 does not fit in float32"),
        (
            ["algorithm.advantage={name: gdpo, weights: {correct: -1.0e+308}}", WEIGHTED],
            "algorithm.advantage.weights.correct: -1e+308 does not fit in float32",
        ),
        (
            ["algorithm.advantage={name: gdpo, std_normalize: true, eps: false}", WEIGHTED],
            "algorithm.advantage.eps: false is a boolean, not a number",
        ),
        (["verifier={name: math, workers: true}"], "verifier.workers: true is a boolean, not a number"),
        (
            ["algorithm.advantage={name: gdpo, weights: {correct: 2, style: 3}}", WEIGHTED],
            "algorithm.advantage.weights.style: 'style' is not a reward part of verifier 'weighted'; its parts: correct, format",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_number_that_would_not_run_as_written_is_refused(tmp_path, monkeypatch, capsys, sets, expected):
    code, output = check(tmp_path, monkeypatch, capsys, *sets)
    assert code == 1, output
    assert expected in output, output
    assert "Traceback" not in output and output.count("error:") == 1, output


def test_integers_from_yaml_and_set_still_pass(tmp_path, monkeypatch, capsys):
    extra = {"rollout": {"engine": {"name": "hf"}, "group_size": 4, "max_staleness": 1}, "train": {"eval_every": 2}}
    code, output = check(
        tmp_path,
        monkeypatch,
        capsys,
        "rollout.prompts_per_step=2",
        "algorithm.kl_coef=1e-3",
        "trainer.lr=2e-4",
        "algorithm.advantage={name: gdpo, weights: {correct: 2, format: 0.5}}",
        WEIGHTED,
        extra=extra,
    )
    assert code == 0, output
    config = yaml.safe_load(output)
    assert (
        config["rollout"]["group_size"],
        config["rollout"]["max_staleness"],
        config["rollout"]["prompts_per_step"],
    ) == (4, 1, 2)
    assert config["trainer"]["lr"] == 2e-4 and config["algorithm"]["advantage"]["weights"] == {
        "correct": 2.0,
        "format": 0.5,
    }


def test_a_third_partys_params_get_the_rule_from_the_base():
    from rlzoo.interfaces import Params

    class Mine(Params):
        count: int = 1
        scale: float = 1.0
        table: dict[str, list[int]] = {}
        flag: bool = False

    assert Mine(count=3, scale="1e-4", table={"a": [1, 2]}, flag=True).scale == 1e-4
    for bad, message in (
        ({"count": True}, "true is a boolean"),
        ({"table": {"a": [1, False]}}, "false is a boolean"),
        ({"scale": -3.5e38}, "does not fit in float32"),
        ({"count": "3"}, "valid integer"),
    ):
        with pytest.raises(ValidationError, match=message):
            Mine(**bad)
