"""The one safe YAML reader (pipeline.yaml, view files): no aliases, no tags, no key twice, no
deep nesting, no huge file; every error one line naming the file and line. Imports PyYAML
alone, so a training node reads a view file without the packing extras."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from etl.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A YAML file larger than 1 MiB is refused: it is a config, not data."""

MAX_DEPTH = 64
"""Deeper YAML nesting is refused (a config needs 5 levels): no RecursionError, ever."""


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases (no object construction, no billion-laughs),
    nesting deeper than MAX_DEPTH, and a key that appears twice in one mapping."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise ConfigError(
                f"{self.name}:{event.start_mark.line + 1}: YAML aliases (*name) are not allowed"
            )
        if self._depth >= MAX_DEPTH:
            raise ConfigError(
                f"{self.name}:{event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in first:
                raise ConfigError(
                    f"{self.name}:{line}: key {key.value!r} appears twice in one mapping "
                    f"(lines {first[key.value]} and {line}); keep one"
                )
            first[key.value] = line
        return node


def read_yaml(path: Path, expected: str) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]]:
    """The mapping a YAML file holds and the line of every key path in it (for errors);
    ConfigError naming the file (and line) for anything else. `expected` says what the
    mapping's keys are, for the error when the file holds no mapping."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; is this a config?")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        loader = _NoAliasLoader(text)
        loader.name = str(path)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    if root is None:
        raise ConfigError(f"{path}: the file is empty")
    data = _construct(root, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping with keys {expected}")
    return data, _line_index(root)


def _line_index(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map every key path (as pydantic reports it) to its 1-based YAML line."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            for sub, line in _line_index(value_node, (*path, key)).items():
                lines.setdefault(sub, line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_index(item, (*path, i)))
    return lines


def _construct(root: yaml.Node, path: Path) -> Any:
    loader = _NoAliasLoader("")
    loader.name = str(path)
    try:
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    finally:
        loader.dispose()


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """One line naming the file and line; PyYAML's own text adds a snippet and a caret."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{path}: invalid YAML: {' '.join(str(exc).split())}"
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = " ".join(str(exc.problem or exc.context or "").split())
    if "constructor for the tag" in problem:
        problem += " (YAML tags are not allowed)"
    return f"{path}:{line}: invalid YAML: {problem}"
