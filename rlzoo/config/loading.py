"""Reading a run config: YAML with duplicate keys refused, ``--set dotted.key=value`` overrides, and writing one back.

The data read here is plain dicts; :mod:`rlzoo.config.resolution` validates it into a :class:`RunConfig`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rlzoo.errors import ConfigError

if TYPE_CHECKING:
    from rlzoo.config.schema import RunConfig


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError([("--set", f"{text!r} is not of the form dotted.key=value")])
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError([("--set", f"{text!r} has an empty key")])
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError([(".".join(path[: i + 1]), f"--set {text!r}: this is a value, not a section")])
            node = child
        node[path[-1]] = value
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain YAML keeps the last and silently
    drops the first, e.g. a whole ``trainer:`` block): :meth:`duplicate_keys` finds them in the composed nodes."""

    def duplicate_keys(self, root: yaml.Node | None) -> list[tuple[str, str]]:
        """``(dotted key, message)`` for every key repeated in a mapping of ``root``'s tree, in line order; ``<<``
        merge keys and the keys they bring in may repeat (an explicit key overrides a merged one, as YAML intends)."""
        found: list[tuple[int, str, str]] = []
        seen: set[int] = set()

        def walk(node: yaml.Node | None, loc: str) -> None:
            if node is None or id(node) in seen:  # an alias repeats a node already walked
                return
            seen.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    walk(item, f"{loc}.{i}" if loc else str(i))
            if not isinstance(node, yaml.MappingNode):
                return
            first: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                scalar = isinstance(key_node, yaml.ScalarNode)
                name = str(key_node.value) if scalar else "?"
                child = f"{loc}.{name}" if loc else name
                if scalar and key_node.tag != "tag:yaml.org,2002:merge":
                    key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                    if key in first:
                        found.append(
                            (
                                line,
                                child,
                                f"duplicate key {name!r} at line {line} (first at line "
                                f"{first[key]}): YAML would keep the second and silently drop the "
                                "first; merge them into one",
                            )
                        )
                    else:
                        first[key] = line
                walk(value_node, child)

        walk(root, "")
        return [(loc, message) for _, loc, message in sorted(found, key=lambda item: item[0])]


def _load_unique_keys(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, but a key repeated in a mapping is a :class:`ConfigError` naming it and both lines."""
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        problems = loader.duplicate_keys(node)
        if problems:
            raise ConfigError(problems, source=source)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([("", f"config file not found: {path}")])
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([("", f"cannot read config file: {err}")], source=str(path)) from None
    try:
        data = _load_unique_keys(text, str(path))
    except yaml.YAMLError as err:
        raise ConfigError([("", f"not valid YAML: {err}")], source=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "the top level must be a mapping of sections")], source=str(path))
    return data


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
