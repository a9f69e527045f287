"""pipeline.yaml -> PipelineConfig (read by `etl.yaml_file`), errors with key path and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from etl.config.pipeline import PipelineConfig
from etl.config.sources import SOURCE_KINDS
from etl.errors import ConfigError
from etl.yaml_file import MAX_CONFIG_BYTES, MAX_DEPTH, read_yaml

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "load_config"]


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
    data, lines = read_yaml(path, "source, stages, output, run")
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
