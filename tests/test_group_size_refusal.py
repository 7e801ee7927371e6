"""``rollout.group_size: 1`` with an advantage that compares a response with its group (``needs_groups``) is refused
before the run, naming the field, instead of training on advantages that are all zero."""

from __future__ import annotations

import pytest

from rlzoo.config.resolution import build_config
from rlzoo.errors import ConfigError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry

GROUPED = [i.name for i in default_registry().components("advantage") if i.cls.needs_groups]
WEIGHTED = {
    "name": "weighted",
    "verifiers": [
        {"name": "exact", "label": "correct"},
        {"name": "regex", "label": "format", "pattern": "x"},
    ],
}


def problems(advantage: dict, group_size: int, tmp_path) -> dict[str, str]:
    registry = default_registry()
    data = {
        "output_dir": str(tmp_path / "run"),
        "rollout": {"group_size": group_size},
        "algorithm": {"advantage": advantage},
        "verifier": WEIGHTED,
    }
    try:
        preflight(build_config(data, registry=registry), registry)
    except ConfigError as err:
        return dict(err.problems)
    return {}


@pytest.mark.parametrize("name", GROUPED)
def test_a_group_advantage_with_one_response_per_prompt_is_refused_naming_the_field(name, tmp_path):
    found = problems({"name": name}, 1, tmp_path)
    assert "rollout.group_size" in found, found
    message = found["rollout.group_size"]
    assert message.startswith(
        f"1, but advantage {name!r} (algorithm.advantage) compares each response with the "
        "others sampled from its prompt"
    ), message
    assert "sample at least 2 per prompt" in message and "optimal-token-baseline" in message  # one that needs none
    assert "rollout.group_size" not in problems({"name": name}, 2, tmp_path)


def test_gdpo_is_among_them_and_lone_response_sources_are_not(tmp_path):
    assert {"group", "rloo", "gdpo", "grpo-passk"} <= set(GROUPED)
    for lone in ("optimal-token-baseline", "reinforce++", "process"):
        assert "rollout.group_size" not in problems({"name": lone}, 1, tmp_path)


def test_a_nested_group_task_of_reverse_kl_is_refused_at_its_own_path(tmp_path):
    found = problems({"name": "reverse-kl", "task": {"name": "rloo"}}, 1, tmp_path)
    assert found["rollout.group_size"].startswith("1, but advantage 'rloo' (algorithm.advantage.task)")
