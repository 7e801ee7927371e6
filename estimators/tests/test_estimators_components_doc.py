"""docs/components.md is generated from the registry and must match what scripts/gen_components_doc.py writes."""

from __future__ import annotations

import importlib.util
import pathlib

from estimators_testlib import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("gen_components_doc", ROOT / "scripts" / "gen_components_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_components_doc_is_up_to_date():
    script = load_script()
    committed = (ROOT / "docs" / "components.md").read_text()
    assert committed == script.render(), "run: python scripts/gen_components_doc.py"


def test_every_component_has_a_row_with_its_formula_and_defaults():
    text = load_script().render(REGISTRY)
    for info in REGISTRY.components():
        line = next(row for row in text.splitlines() if row.startswith(f"| {info.kind} | `{info.name}` |"))
        assert info.cls.formula.replace("|", "\\|") in line
        for name in info.cls.Params.model_fields:
            assert f"`{name}=" in line
