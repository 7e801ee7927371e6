"""Nothing non-finite is saved: the config refuses non-finite numbers everywhere (every section, every component's
parameters), and a step whose weights became non-finite stops the run before its checkpoint is written, the
previous checkpoint intact and ``latest`` still pointing at it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from cli_testlib import run_cli
from test_cli import TINY_RUN

from rlzoo.config.base import ComponentSpec, Section
from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import TinyModelConfig, TrainerConfig
from rlzoo.engines import EngineContext
from rlzoo.engines.torch_trainer import TorchTrainingEngine
from rlzoo.errors import ConfigError
from rlzoo.interfaces.base import Params
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.registry import default_registry
from rlzoo.runtime.checkpoint.digests import verify_checkpoint
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.faults import FaultPolicy, NonFiniteWeights
from rlzoo.util.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"


# -- (a) the config ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("trainer.lr=inf", "trainer.lr"),
        ("trainer.lr=.inf", "trainer.lr"),
        ("trainer.lr=-inf", "trainer.lr"),
        ("trainer.lr=nan", "trainer.lr"),
        ("trainer.lr=NaN", "trainer.lr"),
        ("trainer.betas=[0.9, inf]", "trainer.betas.1"),
        ("trainer.grad_clip=inf", "trainer.grad_clip"),
        ("algorithm.kl_coef=nan", "algorithm.kl_coef"),
        ("cold_start.lr=inf", "cold_start.lr"),
        ("rollout.temperature=inf", "rollout.temperature"),
        ("algorithm.clipper.eps_high=inf", "algorithm.clipper.eps_high"),  # a component's Params
        ("algorithm.reward_shaping=[{name: length, coef: -inf}]", "algorithm.reward_shaping.0.coef"),
        ("trainer.engine.aux_loss_coef=nan", "trainer.engine.aux_loss_coef"),  # an engine's Params
    ],
)
def test_a_non_finite_number_is_refused_naming_its_field(override, field):
    with pytest.raises(ConfigError) as err:
        build_config(read_yaml(EXAMPLE), [override])
    assert (field, "Input should be a finite number") in err.value.problems, err.value.problems


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def test_every_section_and_every_components_parameters_refuse_non_finite_numbers():
    registry = default_registry()
    models = [*_subclasses(Section), *_subclasses(ComponentSpec), Params]
    models += [info.cls.Params for kind in registry.kinds() for info in registry.components(kind)]
    for model in models:
        assert model.model_config.get("allow_inf_nan") is False, model
        for name, info in model.model_fields.items():  # no field opts out
            assert all(getattr(m, "allow_inf_nan", None) is not True for m in info.metadata), (model, name)
    # and nothing defaults to a non-finite number that the config would then refuse to read back
    for kind in registry.kinds():
        for info in registry.components(kind):
            try:
                defaults = info.cls.Params()
            except Exception:  # required parameters (a dataset's path): nothing to check
                continue
            info.cls.Params.model_validate(defaults.model_dump())
    build_config({}, [])  # every section's defaults are finite


def test_config_check_refuses_inf_through_set(tmp_path):
    argv = ["config", "check", str(EXAMPLE), "--set", "trainer.lr=inf", "--set", "algorithm.kl_coef=nan"]
    proc = run_cli(argv, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "trainer.lr: Input should be a finite number" in proc.stderr, proc.stderr
    assert "algorithm.kl_coef: Input should be a finite number" in proc.stderr, proc.stderr


# -- (b) the weights ---------------------------------------------------------------------------------------------


def _torch_engine(tmp_path: Path) -> TorchTrainingEngine:
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64
    )
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "m")
    engine = TorchTrainingEngine()
    engine.start(EngineContext(tmp_path / "m", pad_token_id=0, eos_token_id=1), TrainerConfig())
    return engine


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_the_torch_engine_tells_non_finite_weights(tmp_path, value):
    engine = _torch_engine(tmp_path)
    assert engine.weights_finite()
    with torch.no_grad():
        list(engine.model.parameters())[-1].view(-1)[3] = value
    assert not engine.weights_finite()


class _Engine:
    def __init__(self, finite: bool) -> None:
        self.finite = finite

    def weights_finite(self) -> bool:
        return self.finite


def test_the_fault_policy_stops_before_a_non_finite_checkpoint(tmp_path):
    policy = FaultPolicy(3, responses_per_step=8, run_dir=tmp_path)
    policy.check_weights(0, {"policy": _Engine(True), "critic": _Engine(True)})
    with pytest.raises(NonFiniteWeights) as err:
        policy.check_weights(0, {"policy": _Engine(False)})
    assert "stopped at step 0: the policy's weights are not finite" in str(err.value)
    assert "no checkpoint had been written yet" in str(err.value)
    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004" / "state.json").write_text('{"completed_steps": 4}')
    atomic_write_text(tmp_path / "checkpoints" / "latest", "step_000004")
    with pytest.raises(NonFiniteWeights) as err:
        policy.check_weights(5, {"policy": _Engine(True), "critic": _Engine(False)})
    message = str(err.value)
    assert message.startswith("stopped at step 5: the critic's weights are not finite (NaN or infinite)"), message
    assert f"the last checkpoint, {tmp_path / 'checkpoints' / 'step_000004'}, is intact" in message
    assert f"--resume {tmp_path}" in message and "\n" not in message


# ZeRO-3 partitions every parameter (the module's own tensors are empty): each rank checks its partition
ZERO3 = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    from rlzoo.config.schema import TinyModelConfig, TrainerConfig
    from rlzoo.engines import EngineContext
    from rlzoo.engines.deepspeed.trainer import DeepSpeedTrainingEngine
    from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model

    root = Path(sys.argv[1])
    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64)
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, root / "m")
    engine = DeepSpeedTrainingEngine(DeepSpeedTrainingEngine.Params(zero_stage=3))
    engine.start(EngineContext(root / "m", pad_token_id=0, eos_token_id=1), TrainerConfig())
    param = list(engine.model.parameters())[-1]
    assert param.numel() == 0 and param.ds_tensor.numel() > 0, (param.shape, param.ds_tensor.shape)
    print("before", engine.weights_finite())
    with torch.no_grad():
        param.ds_tensor.view(-1)[0] = float("nan")
    print("after", engine.weights_finite())
    """
)


def test_the_deepspeed_engine_checks_its_zero3_partition(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    proc = subprocess.run([sys.executable, "-c", ZERO3, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "before True" in proc.stdout and "after False" in proc.stdout, proc.stdout


def poison_after_step_one(monkeypatch) -> None:
    """The policy's weights turned NaN after step 1's update (its metrics were finite)."""
    import rlzoo.rl.loop as loop

    real_step = loop.rl_step

    def rl_step(step, prompts, components, config):
        metrics = real_step(step, prompts, components, config)
        if step == 1:
            with torch.no_grad():
                next(components.learner.engine.model.parameters()).view(-1)[0] = float("nan")
        return metrics

    monkeypatch.setattr(loop, "rl_step", rl_step)


TINY = ["rollout.engine={name: hf}", "trainer.engine={name: torch}", *TINY_RUN, "train.steps=3", "train.eval_every=10"]


def test_non_finite_weights_stop_the_run_before_their_checkpoint(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(apply_overrides(read_yaml(EXAMPLE), [*TINY, f"cold_start.output_dir={tmp_path / 'cold'}"]))
    )
    run_dir = tmp_path / "run"
    poison_after_step_one(monkeypatch)
    proc = run_cli(["train", str(config), "--set", f"output_dir={run_dir}"], tmp_path)

    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    first = run_dir / "checkpoints" / "step_000001"
    assert error == (
        "error: stopped at step 1: the policy's weights are not finite (NaN or infinite) after this step's updates, "
        "so its checkpoint was not written (a learning rate too high, e.g. trainer.lr, can do this); the last "
        f"checkpoint, {first}, is intact: fix the cause, then continue with `rlzoo train CONFIG --resume {run_dir}`"
    ), error
    assert latest_checkpoint(run_dir) == first
    assert sorted(p.name for p in first.parent.iterdir()) == ["latest", "step_000001"]  # no step 2, no leftovers
    assert verify_checkpoint(first).intact
    assert json.loads((first / "state.json").read_text()) == {"completed_steps": 1}
