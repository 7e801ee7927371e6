"""Run configs: YAML loading, --set overrides, presets, parameter validation, error reporting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rlzoo.config.loading import apply_overrides, dump_config, parse_override, read_yaml
from rlzoo.config.presets import PRESETS
from rlzoo.config.resolution import build_config, load_config
from rlzoo.config.schema import RunConfig
from rlzoo.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(err: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    return dict(err.value.problems)


# -- YAML loading ----------------------------------------------------------------------------------------------


def test_yaml_loading(tmp_path):
    path = write(
        tmp_path,
        """
        seed: 7
        output_dir: runs/x
        algorithm:
          ratio: {name: sequence}
          clipper: {name: ppo, eps_low: 0.1, eps_high: 0.3}
          kl_coef: 0.01
        train:
          steps: 3
        """.replace("\n        ", "\n"),
    )
    config = load_config(path)
    assert isinstance(config, RunConfig)
    assert config.seed == 7 and config.output_dir == "runs/x"
    assert config.algorithm.ratio.name == "sequence"
    assert config.algorithm.clipper.params == {"eps_low": 0.1, "eps_high": 0.3}
    assert config.algorithm.kl_coef == 0.01
    assert config.train.steps == 3
    assert config.train.eval_every == 5  # section default


def test_empty_file_is_the_default_config(tmp_path):
    config = load_config(write(tmp_path, ""))
    assert config.algorithm.ratio.name == "token"
    assert config.algorithm.clipper.params == {"eps_low": 0.2, "eps_high": 0.2}


def test_example_config_loads():
    config = load_config(REPO / "examples" / "gspo_tiny_moe.yaml")
    assert config.algorithm.preset == "gspo"
    assert config.algorithm.ratio.name == "sequence"
    assert config.algorithm.clipper.params["eps_high"] == pytest.approx(4e-4)


# -- overrides -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, path, value",
    [
        ("train.steps=7", ["train", "steps"], 7),
        ("trainer.lr=0.5", ["trainer", "lr"], 0.5),
        ("cold_start.enabled=false", ["cold_start", "enabled"], False),
        ("cold_start.enabled=true", ["cold_start", "enabled"], True),
        ("trainer.betas=[0.8, 0.95]", ["trainer", "betas"], [0.8, 0.95]),
        ("verifier=null", ["verifier"], None),
        ("output_dir=runs/a=b", ["output_dir"], "runs/a=b"),
        ("algorithm.ratio.name=sequence", ["algorithm", "ratio", "name"], "sequence"),
        ("task.name=", ["task", "name"], ""),
    ],
)
def test_parse_override_yaml_typed(text, path, value):
    assert parse_override(text) == (path, value)


def test_overrides_apply_with_yaml_types(tmp_path):
    path = write(
        tmp_path,
        (
            "train: {steps: 3}\ncold_start: {enabled: true}\nverifier: {name: exact}\n"
            "algorithm: {clipper: {name: ppo}}\n"
        ),
    )
    config = load_config(
        path,
        [
            "train.steps=11",
            "trainer.lr=0.25",
            "cold_start.enabled=false",
            "trainer.betas=[0.8, 0.95]",
            "verifier=null",
            "algorithm.clipper.eps_high=0.28",
            "rollout.engine.name=hf",
        ],
    )
    assert config.train.steps == 11
    assert config.trainer.lr == 0.25
    assert config.cold_start.enabled is False
    assert config.trainer.betas == (0.8, 0.95)
    assert config.verifier is None
    assert config.algorithm.clipper.name == "ppo"
    assert config.algorithm.clipper.params["eps_high"] == 0.28


def test_override_creates_missing_sections_and_fills_null_sections():
    data = apply_overrides({"verifier": None}, ["verifier.name=math", "algorithm.kl_coef=0.1"])
    assert data == {"verifier": {"name": "math"}, "algorithm": {"kl_coef": 0.1}}
    assert build_config({}, ["verifier.name=math"]).verifier.name == "math"


def test_override_does_not_mutate_input():
    data = {"train": {"steps": 1}}
    apply_overrides(data, ["train.steps=2"])
    assert data == {"train": {"steps": 1}}


def test_override_through_a_value_is_an_error():
    with pytest.raises(ConfigError) as info:
        apply_overrides({"seed": 3}, ["seed.x=1"])
    assert problems_of(info).keys() == {"seed"}
    assert "not a section" in problems_of(info)["seed"]
    with pytest.raises(ConfigError, match="not a section"):
        build_config({"algorithm": {"kl_coef": 0.0}}, ["algorithm.kl_coef.value=1"])


@pytest.mark.parametrize("text", ["train.steps", "=3", "train..steps=3", ".steps=1"])
def test_malformed_override_is_an_error(text):
    with pytest.raises(ConfigError) as info:
        parse_override(text)
    assert info.value.problems[0][0] == "--set"


def test_override_to_unknown_field_is_an_error():
    with pytest.raises(ConfigError) as info:
        build_config({}, ["train.stepz=3"])
    assert "train.stepz" in problems_of(info)


# -- presets ---------------------------------------------------------------------------------------------------

# as documented in rlzoo/config/presets.py (from the papers): ratio, advantage, clipper, aggregation, kl, kl_coef
DOCUMENTED = {
    "grpo": ("token", ("group", {"std_normalize": True}), (0.2, 0.2), "seq-mean-token-mean", "k3", 0.04),
    "dr-grpo": ("token", ("group", {"std_normalize": False}), (0.2, 0.2), "seq-mean-token-sum-norm", "k3", 0.0),
    "dapo": ("token", ("group", {"std_normalize": True}), (0.2, 0.28), "token-mean", "k3", 0.0),
    "gspo": ("sequence", ("group", {"std_normalize": True}), (3e-4, 4e-4), "seq-mean-token-mean", "k3", 0.0),
    "gspo-token": (
        "sequence-token",
        ("group", {"std_normalize": True}),
        (3e-4, 4e-4),
        "seq-mean-token-mean",
        "k3",
        0.0,
    ),
    "rloo": ("token", ("rloo", {}), (0.2, 0.2), "seq-mean-token-mean", "k3", 0.0),
    "reinforce++": ("token", ("reinforce++", {"gamma": 1.0}), (0.2, 0.2), "token-mean", "k3", 0.0),
    "reinforce++-baseline": ("token", ("reinforce++-baseline", {}), (0.2, 0.2), "token-mean", "k3", 0.0),
    "opo": ("token", ("opo", {}), (0.2, 0.2), "token-mean", "k3", 0.0),
    "bnpo": ("token", ("group", {"std_normalize": True}), (0.2, 0.2), "token-mean", "k3", 0.0),
    "luspo": ("sequence", ("group", {"std_normalize": True}), (3e-4, 4e-4), "seq-mean-token-sum", "k3", 0.0),
    "gdpo": ("token", ("gdpo", {"std_normalize": True, "parts": None}), (0.2, 0.2), "token-mean", "k3", 0.0),
    "remax": ("token", ("remax", {}), (0.2, 0.2), "token-mean", "k1", 0.0),
}
# presets whose clipper is not ppo: ratio, advantage, clipper spec, aggregation, kl_coef, minibatches_per_rollout
DOCUMENTED_ZOO = {
    "cispo": ("token", "group", {"name": "cispo", "eps_low": 1.0, "eps_high": 4.0}, "token-mean", 0.0, 4),
    "sapo": ("token", "group", {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}, "seq-mean-token-mean", 0.0, 4),
    "gmpo": ("token", "group", {"name": "gmpo", "eps_low": 0.4, "eps_high": 0.4}, "seq-mean-token-mean", 0.0, 4),
    "gpg": ("gpg", "gpg", {"name": "none"}, "token-mean", 0.0, 1),
    "ppo": ("token", "gae", {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2}, "token-mean", 0.0, 4),
    "kl-cov": ("token", "group", {"name": "kl-cov", "select_fraction": 0.0002, "kl_coef": 1.0}, "token-mean", 0.0, 4),
    "clip-cov": (
        "token",
        "group",
        {"name": "clip-cov", "eps_low": 0.2, "eps_high": 0.2, "select_fraction": 0.0002, "lb": 1.0, "ub": 5.0},
        "token-mean",
        0.0,
        4,
    ),
    "dppo-tv": (
        "token",
        "group",
        {"name": "dppo-tv", "eps_low": 0.15, "eps_high": 0.15, "c": 20.0},
        "seq-mean-token-sum-norm",
        0.0,
        4,
    ),
    "dppo-kl": (
        "token",
        "group",
        {"name": "dppo-kl", "eps_low": 0.05, "eps_high": 0.05, "c": 20.0},
        "seq-mean-token-sum-norm",
        0.0,
        4,
    ),
    "vespo": (
        "token",
        "group",
        {"name": "vespo", "k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
        "token-mean",
        0.0,
        4,
    ),
}


def test_every_preset_is_tested():
    assert set(PRESETS) == set(DOCUMENTED) | set(DOCUMENTED_ZOO)


def test_ppo_preset_has_a_critic_and_the_kl_in_the_reward():
    algorithm = build_config({"algorithm": {"preset": "ppo", "critic": {"lr": 3e-5}}}).algorithm
    assert algorithm.critic is not None and algorithm.critic.lr == 3e-5  # the user's keys merge into the preset's
    assert algorithm.critic.value_loss.name == "clipped" and algorithm.critic.value_loss.params == {"clip_range": 0.5}
    assert (algorithm.kl_in_reward.name, algorithm.kl_in_reward.params, algorithm.kl.name) == (
        "fixed",
        {"coef": 0.001},
        "k1",
    )
    assert build_config({"algorithm": {"preset": "ppo", "critic": None}}).algorithm.critic is None


@pytest.mark.parametrize("preset", sorted(DOCUMENTED_ZOO))
def test_zoo_preset_expands_to_documented_components(preset):
    ratio, advantage, clipper, aggregation, kl_coef, minibatches = DOCUMENTED_ZOO[preset]
    algorithm = build_config({"algorithm": {"preset": preset}}).algorithm
    chosen = (algorithm.ratio.name, algorithm.advantage.name, algorithm.aggregation.name)
    assert chosen == (ratio, advantage, aggregation)
    assert {"name": algorithm.clipper.name, **algorithm.clipper.params} == clipper
    assert algorithm.kl_coef == kl_coef and algorithm.minibatches_per_rollout == minibatches


@pytest.mark.parametrize("preset", sorted(DOCUMENTED))
def test_preset_expands_to_documented_components(preset):
    ratio, (advantage, adv_params), (eps_low, eps_high), aggregation, kl, kl_coef = DOCUMENTED[preset]
    algorithm = build_config({"algorithm": {"preset": preset}}).algorithm
    assert algorithm.preset == preset
    assert algorithm.ratio.name == ratio
    assert algorithm.advantage.name == advantage
    for key, value in adv_params.items():
        assert algorithm.advantage.params[key] == value
    assert algorithm.clipper.name == "ppo"
    assert algorithm.clipper.params["eps_low"] == pytest.approx(eps_low)
    assert algorithm.clipper.params["eps_high"] == pytest.approx(eps_high)
    assert algorithm.aggregation.name == aggregation
    assert algorithm.kl.name == kl
    assert algorithm.kl_coef == pytest.approx(kl_coef)


def test_preset_can_be_chosen_by_override():
    config = build_config({}, ["algorithm.preset=gspo"])
    assert config.algorithm.ratio.name == "sequence"


def test_user_field_overrides_preset_param():
    algorithm = build_config({"algorithm": {"preset": "gspo", "clipper": {"eps_high": 0.01}, "kl_coef": 0.5}}).algorithm
    assert algorithm.clipper.name == "ppo"
    assert algorithm.clipper.params["eps_high"] == 0.01
    assert algorithm.clipper.params["eps_low"] == pytest.approx(3e-4)  # the rest of the preset's clipper stays
    assert algorithm.kl_coef == 0.5
    assert algorithm.ratio.name == "sequence"


def test_user_field_overrides_preset_param_via_set():
    algorithm = build_config({"algorithm": {"preset": "dapo"}}, ["algorithm.clipper.eps_high=0.3"]).algorithm
    assert (algorithm.clipper.params["eps_low"], algorithm.clipper.params["eps_high"]) == (0.2, 0.3)


def test_same_name_in_user_spec_merges_with_preset():
    algorithm = build_config({"algorithm": {"preset": "gspo", "clipper": {"name": "ppo", "eps_low": 0.1}}}).algorithm
    assert algorithm.clipper.params["eps_low"] == 0.1
    assert algorithm.clipper.params["eps_high"] == pytest.approx(4e-4)


def test_other_component_name_replaces_preset_spec():
    algorithm = build_config({"algorithm": {"preset": "gspo", "clipper": {"name": "dual-clip", "c": 5.0}}}).algorithm
    assert algorithm.clipper.name == "dual-clip"
    # gspo's eps_low/eps_high (3e-4/4e-4) were dropped with the ppo spec; dual-clip's own defaults apply
    assert algorithm.clipper.params == {"eps_low": 0.2, "eps_high": 0.2, "c": 5.0}


def test_replacing_component_does_not_inherit_params_it_does_not_have():
    # std_normalize belongs to the preset's `group` advantage; `rloo` does not take it, so it must not leak in
    algorithm = build_config({"algorithm": {"preset": "grpo", "advantage": {"name": "rloo"}}}).algorithm
    assert algorithm.advantage.name == "rloo"
    assert "std_normalize" not in algorithm.advantage.params


def test_unknown_preset_is_an_error_with_suggestion():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"preset": "gspoo"}})
    problems = problems_of(info)
    assert list(problems) == ["algorithm.preset"]
    assert "unknown preset 'gspoo'" in problems["algorithm.preset"]
    assert "did you mean 'gspo'?" in problems["algorithm.preset"]
    for name in PRESETS:
        assert name in problems["algorithm.preset"]


# -- component validation --------------------------------------------------------------------------------------


def test_misspelt_component_param_is_an_error_not_ignored():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"clipper": {"name": "ppo", "eps_hgh": 0.3}}})
    problems = problems_of(info)
    assert list(problems) == ["algorithm.clipper.eps_hgh"]
    assert "did you mean 'eps_high'?" in problems["algorithm.clipper.eps_hgh"]
    assert "algorithm.clipper.eps_hgh" in str(info.value)


def test_misspelt_param_on_top_of_preset_is_an_error():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"preset": "gspo"}}, ["algorithm.clipper.eps_hihg=0.1"])
    assert "algorithm.clipper.eps_hihg" in problems_of(info)


def test_misspelt_section_field_is_an_error():
    with pytest.raises(ConfigError) as info:
        build_config({"trainer": {"lrr": 0.1}, "algoritm": {}})
    assert {"trainer.lrr", "algoritm"} <= set(problems_of(info))


def test_unknown_component_name_is_an_error_with_suggestion():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"ratio": {"name": "sequense"}}})
    problems = problems_of(info)
    assert list(problems) == ["algorithm.ratio.name"]
    message = problems["algorithm.ratio.name"]
    assert "did you mean 'sequence'?" in message
    assert "token" in message and "sequence-token" in message


def test_component_spec_without_name_tunes_the_default_component():
    config = build_config({"algorithm": {"clipper": {"eps_high": 0.3}}, "task": {"digits": 3}})
    assert config.algorithm.clipper.name == "ppo"
    assert config.algorithm.clipper.params == {"eps_low": 0.2, "eps_high": 0.3}
    assert config.task.name == "arithmetic" and config.task.params["digits"] == 3


def test_component_spec_without_name_still_validates_its_params():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"clipper": {"eps_hgh": 0.3}}})
    assert "algorithm.clipper.eps_hgh" in problems_of(info)


def test_resolved_config_fills_component_defaults():
    config = build_config({"algorithm": {"clipper": {"name": "ppo"}, "ratio": {"name": "token"}}})
    assert config.algorithm.clipper.params == {"eps_low": 0.2, "eps_high": 0.2}
    dumped = yaml.safe_load(dump_config(config))
    assert dumped["algorithm"]["clipper"] == {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2}
    assert dumped["algorithm"]["advantage"]["name"] == "group"
    assert "std_normalize" in dumped["algorithm"]["advantage"]
    # the resolved dump is itself a valid config that resolves to the same thing
    assert build_config(dumped) == config


def test_param_values_are_validated():
    with pytest.raises(ConfigError) as info:
        build_config({"algorithm": {"clipper": {"name": "ppo", "eps_low": 2}}})
    assert "algorithm.clipper.eps_low" in problems_of(info)


# -- files -----------------------------------------------------------------------------------------------------


def test_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_directory_is_config_error(tmp_path):
    with pytest.raises(ConfigError):
        load_config(tmp_path)


def test_invalid_yaml_is_config_error(tmp_path):
    path = write(tmp_path, "algorithm: {ratio: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "not valid YAML" in str(info.value)
    assert str(path) in str(info.value)


def test_non_mapping_top_level_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_binary_file_is_config_error(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\xff\xfe\x00\x81garbage\x9c")
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert str(path) in str(info.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_config_error(tmp_path):
    path = write(tmp_path, "seed: 1\n")
    path.chmod(0)
    try:
        with pytest.raises(ConfigError):
            read_yaml(path)
    finally:
        path.chmod(0o644)


def test_unreadable_file_is_config_error_even_as_root(tmp_path, monkeypatch):
    path = write(tmp_path, "seed: 1\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert "Permission denied" in str(info.value)


# -- several problems at once ----------------------------------------------------------------------------------


def test_multiple_component_problems_reported_together(tmp_path):
    path = write(
        tmp_path,
        "algorithm:\n"
        "  ratio: {name: sequense}\n"
        "  clipper: {name: ppo, eps_hgh: 0.3}\n"
        "  aggregation: {name: token-meen}\n"
        "task: {name: arithmetic, digitz: 2}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = problems_of(info)
    assert {
        "algorithm.ratio.name",
        "algorithm.clipper.eps_hgh",
        "algorithm.aggregation.name",
        "task.digitz",
    } <= set(problems)
    assert str(path) in str(info.value)


def test_multiple_structural_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        build_config({"train": {"steps": -1}, "rollout": {"top_p": 2.0}, "seed": "x"})
    assert {"train.steps", "rollout.top_p", "seed"} <= set(problems_of(info))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_states_only_what_differs_from_the_defaults(preset):
    """Every value a preset writes differs from the default it would otherwise get (a component's own parameter
    default, the default component, the config field's default): each default is defined in one place."""
    from rlzoo.config.algorithm import AlgorithmConfig
    from rlzoo.config.presets import DEFAULT_COMPONENTS
    from rlzoo.registry import default_registry

    registry = default_registry()
    kinds = {"reward_shaping": "reward_shaper", "regularisers": "regulariser", "kl_in_reward": "kl_controller"}
    for key, value in PRESETS[preset].items():
        if key == "critic":  # a section, not a component: its keys differ from CriticConfig's defaults
            from rlzoo.config.algorithm import CriticConfig

            assert all(v != CriticConfig.model_fields[k].default for k, v in value.items()), (preset, key)
            continue
        specs = value if isinstance(value, list) else [value] if isinstance(value, dict) else None
        if specs is None:
            assert value != AlgorithmConfig.model_fields[key].default, (preset, key)
            continue
        for spec in specs:
            default = DEFAULT_COMPONENTS.get(key, {})
            name = spec.get("name", default.get("name"))
            assert "name" not in spec or spec["name"] != default.get("name"), (preset, key, "names the default")
            params = registry.get(kinds.get(key, key), name).cls.Params()
            same = [k for k, v in spec.items() if k != "name" and getattr(params, k) == v]
            assert not same, (preset, key, same)
