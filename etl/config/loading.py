"""The only place YAML is read: pipeline.yaml -> PipelineConfig, errors with key path and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from etl.config.pipeline import PipelineConfig
from etl.config.sources import SOURCE_KINDS
from etl.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A pipeline.yaml larger than 1 MiB is refused: it is a config, not data."""

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


def _yaml_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic puts the union tag in `loc`: (source, folder, path) is YAML's (source, path).
    A stage's tag is also its single YAML key, so (stages, 1, resize, size) needs no change."""
    if len(loc) >= 2 and loc[0] == "source" and loc[1] in SOURCE_KINDS:
        return (loc[0], *loc[2:])
    return loc


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _lookup_line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def load_config(path: Path | str, **overrides: Any) -> PipelineConfig:
    """Read, validate and resolve pipeline.yaml. Relative paths are relative to the file's folder.

    `overrides` replace `run` fields (the CLI's --jobs/--backend/--address) when not None.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
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
        raise ConfigError(f"{path}:1: expected a mapping with keys source, stages, output, run")
    lines = _line_index(root)
    run = dict(data.get("run") or {})
    run.update({k: v for k, v in overrides.items() if v is not None})
    if run:
        data["run"] = run
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _yaml_path(tuple(err["loc"]))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(
            f"{path}:{_lookup_line(lines, loc)}: {_format_loc(loc)}: {msg}{more}"
        ) from None
    return _resolve_paths(config, path.parent)


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


def _resolve_paths(config: PipelineConfig, base: Path) -> PipelineConfig:
    def resolve(p: Path) -> Path:
        return (p if p.is_absolute() else base / p).resolve()

    # every Path of a source (path, an LMDB source's labels) is relative to the config file
    paths = {k: resolve(v) for k, v in config.source if isinstance(v, Path)}
    source = config.source.model_copy(update=paths)
    out = config.output.dir  # a URL stays as it is
    resolved = resolve(out) if isinstance(out, Path) else out
    output = config.output.model_copy(update={"dir": resolved})
    return config.model_copy(update={"source": source, "output": output})
