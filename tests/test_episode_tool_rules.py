"""The config's rules about tools (issue 36): each tool listed once in ``episode.tools``, and a policy whose
tokenizer can write the tool-call markup the parser declares (``ToolCallParser.call_markup``,
:func:`rlzoo.episodes.rules.tool_markup_rule`). Through the real CLI: tests/test_fault_table_config.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from folder_testlib import write_weights

from rlzoo.config.resolution import build_config
from rlzoo.episodes.rules import _writable, tool_markup_rule
from rlzoo.errors import ConfigError
from rlzoo.interfaces import ToolCallParser
from rlzoo.models.tokenizer import char_vocab
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry

TOOLS = {"environment": {"name": "tools"}, "tools": [{"name": "calculator"}], "max_turns": 2}
HERMES = '<tool_call>{"name":"","arguments":{}}</tool_call>'


def _problems(data: dict, tmp_path: Path) -> list[tuple[str, str]]:
    registry = default_registry()
    try:
        preflight(build_config({"output_dir": str(tmp_path / "run"), **data}, registry=registry), registry)
    except ConfigError as err:
        return err.problems
    return []


# -- each tool once -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("second", [{"name": "calculator"}, {"name": "calculator", "timeout_s": 2}])
def test_a_tool_listed_twice_is_refused_at_its_index(second):
    tools = [{"name": "python"}, {"name": "calculator"}, second]
    with pytest.raises(ConfigError) as info:
        build_config({"episode": {**TOOLS, "tools": tools}})
    ((loc, message),) = info.value.problems
    assert loc == "episode.tools.2"
    assert "tool 'calculator' is listed twice (first at episode.tools.1)" in message


def test_distinct_tools_pass():
    config = build_config({"episode": {**TOOLS, "tools": [{"name": "calculator"}, {"name": "python"}]}})
    assert [t.name for t in config.episode.tools] == ["calculator", "python"]


# -- the tool-call markup -----------------------------------------------------------------------------------------


def test_hermes_declares_its_markup():
    registry = default_registry()
    assert registry.get("tool_parser", "hermes").cls.call_markup == HERMES
    assert ToolCallParser.call_markup == ""  # a parser that declares nothing is not checked


def test_a_task_whose_alphabet_cannot_write_the_markup_is_refused(tmp_path):
    problems = _problems({"episode": TOOLS}, tmp_path)  # arithmetic: digits and + - * = only
    ((loc, message),) = [p for p in problems if p[0] == "episode.tool_parser"]
    assert "'hermes' writes a call as " + HERMES in message
    assert "built from the alphabet of task 'arithmetic'" in message
    missing = set("".join(HERMES) + "calculator") - set("0123456789+-*=")
    assert f"cannot write {', '.join(map(repr, sorted(missing)))}, so" in message


def test_a_task_whose_alphabet_writes_the_markup_passes(tmp_path):
    assert _problems({"task": {"name": "calculator-arithmetic"}, "episode": TOOLS}, tmp_path) == []


def test_a_tool_name_the_alphabet_lacks_is_named(tmp_path):
    """calculator-arithmetic holds printable ASCII: a tool whose name has another character is refused for it."""
    import types

    import rlzoo
    from rlzoo.interfaces import Tool
    from rlzoo.registry import Registry

    class Umlaut(Tool):
        name = "zähler"

    registry = Registry.discover()  # its own: default_registry() is shared by every test of the session
    plugin = types.ModuleType("umlaut_tool")

    def rlzoo_tools():
        return [Umlaut]

    plugin.rlzoo_tools = rlzoo.hookimpl(rlzoo_tools)
    registry.add_plugin(plugin, name="umlaut", distribution="tests")
    config = build_config(
        {
            "output_dir": str(tmp_path / "run"),
            "task": {"name": "calculator-arithmetic"},
            "episode": {**TOOLS, "tools": [{"name": "zähler"}]},
        },
        registry=registry,
    )
    with pytest.raises(ConfigError) as info:
        preflight(config, registry)
    ((loc, message),) = info.value.problems
    assert loc == "episode.tool_parser" and "(zähler)" in message and "cannot write 'ä', so" in message


def _folder(root: Path, vocab: dict[str, int]) -> str:
    """A model folder whose tokenizer.json has ``vocab`` (the preflight reads files; nothing loads the weights)."""
    root.mkdir()
    hf = {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": max(vocab.values()) + 1,
        "max_position_embeddings": 256,
    }
    (root / "config.json").write_text(json.dumps(hf))
    (root / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": []})
    )
    write_weights(root)  # the tensors config.json describes, zeros
    return str(root)


def test_a_model_folder_whose_tokenizer_cannot_write_the_markup_is_refused(tmp_path):
    """A cold-start folder of the arithmetic task used as model.path: its character tokenizer has no ``<``."""
    folder = _folder(tmp_path / "chars", char_vocab("0123456789+-*="))
    data = {"model": {"path": folder}, "cold_start": {"enabled": False}, "episode": TOOLS}
    problems = [p for p in _problems(data, tmp_path) if p[0] == "episode.tool_parser"]
    assert len(problems) == 1 and f"the tokenizer.json of {folder}" in problems[0][1], problems


def test_byte_level_and_byte_fallback_tokenizers_write_every_character(tmp_path):
    from rlzoo.models.chat import build_chat_tokenizer

    tok = build_chat_tokenizer(["What is 3*5?"] * 4, vocab_size=300)  # a byte-level BPE, as Qwen's
    tok.save_pretrained(tmp_path / "bpe")
    vocab = json.loads((tmp_path / "bpe" / "tokenizer.json").read_text())["model"]["vocab"]
    assert all(_writable(c, vocab) for c in HERMES + " \n\tä€")
    fallback = {f"<0x{b:02X}>": b for b in range(256)}  # SentencePiece's byte fallback
    assert all(_writable(c, fallback) for c in HERMES + " \nä")
    assert not _writable("<", char_vocab("0123456789")) and _writable("<", char_vocab("<>"))


def test_the_rule_is_silent_without_a_tool_environment_or_a_known_tokenizer(tmp_path):
    from rlzoo.interfaces import RunFacts
    from rlzoo.models.folder import ModelFacts

    registry = default_registry()
    config = build_config({"model": {"path": str(tmp_path / "absent")}, "episode": TOOLS}, registry=registry)
    components = {
        loc: registry.create("tool_parser" if "parser" in loc else "environment", spec.name)
        for loc, spec in (
            ("episode.environment", config.episode.environment),
            ("episode.tool_parser", config.episode.tool_parser),
        )
    }
    facts = RunFacts(config, ModelFacts(moe=None, head_dim=None, max_positions=None), 1, registry, components)
    assert tool_markup_rule(facts) == []  # no tokenizer.json to read (a --model-config check): not guessed
    single = build_config({}, registry=registry)
    assert tool_markup_rule(RunFacts(single, facts.model, 1, registry, {})) == []
