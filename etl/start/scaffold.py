"""`etl init`: write a commented pipeline.yaml for a class-per-folder tree.

`render` turns what `etl.start.survey` found into YAML text in which every key is written out
with its default, taken from the config models themselves so the file cannot drift from the
schema; `write` puts it in place. The file loads with `etl.config.load_config` as is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from etl.config import (
    SHARD_BYTES,
    DecodeStage,
    FolderSource,
    OutputConfig,
    ResizeStage,
    RunConfig,
    ValidateStage,
)
from etl.errors import EtlError
from etl.format.atomic import replacing
from etl.start.survey import Survey

MAX_CLASSES_LISTED = 100
"""Classes listed one per line in the header comment; beyond that, a count."""


# --- rendering --------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./@+-]*")


def yaml_value(value: Any) -> str:
    """One value in YAML flow style; strings are quoted unless they read back unchanged."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        text = str(value)
        return text if _PLAIN.fullmatch(text) and _reads_back(text) else _double_quoted(text)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{yaml_value(k)}: {yaml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no YAML form for {value!r}")


def _reads_back(text: str) -> bool:
    """Whether `text` unquoted is that same string to YAML; False for text YAML reads as
    something else or refuses, such as '...' (a document end marker)."""
    try:
        return bool(yaml.safe_load(text) == text)
    except yaml.YAMLError:
        return False


def _double_quoted(text: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are, the rest escaped.

    NOTE: not json.dumps: PyYAML reads its surrogate pairs for astral characters as two."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def _kv(indent: int, key: str, value: Any, comment: str = "") -> str:
    text = f"{' ' * indent}{key}: {yaml_value(value)}"
    return f"{text:<24}  # {comment}" if comment else text


def _comment(text: str) -> str:
    """Names found on disk are shown in comments: no newline or control character gets through."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def render(found: Survey, config_path: Path) -> str:
    """The commented pipeline.yaml for `found`, to be written at `config_path` (relative paths in
    it are relative to that file's folder, as `load_config` reads them)."""
    base = config_path.resolve().parent
    output_dir = base / "artifacts"
    if output_dir == found.root or output_dir.is_relative_to(found.root):
        output_dir = found.root.parent / f"{found.root.name}-artifacts"  # never inside the source
    sections = [
        _found_comment(found, base, config_path.name),
        _source_lines(found, base),
        _stage_lines(found),
        _output_lines(output_dir, base),
        _run_lines(),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def _found_comment(found: Survey, base: Path, name: str) -> list[str]:
    """The comment that says what `etl init` found: images, classes, sizes, unreadable files."""
    size = found.size
    head = [
        f"# {name} for {_comment(_relative(found.root, base))}, written by `etl init`.",
        "# Every key is written out with its default unless a comment says otherwise;",
        "# docs/configuration.md documents them.",
        f"# Check it: etl validate {name}    Run it: etl run {name}",
        "#",
        f"# Found {found.images} images in {len(found.classes)} class folders "
        "(label = index in sorted names):",
    ]
    width = max(len(_comment(c)) for c in found.classes)
    for cls, n in list(found.classes.items())[:MAX_CLASSES_LISTED]:
        head.append(f"#   {_comment(cls):<{width}}  {n}")
    if len(found.classes) > MAX_CLASSES_LISTED:
        head.append(f"#   ... and {len(found.classes) - MAX_CLASSES_LISTED} more classes")
    if found.outside:
        head.append(
            f"# {found.outside} file(s) are outside any class folder (or link outside it): "
            "`etl run` rejects them."
        )
    if found.median_hw is not None and found.median_shorter is not None:
        h, w = found.median_hw
        head.append(
            f"# Source sizes: median {h}x{w} (HxW) over {found.sampled - found.unreadable} "
            f"sampled images; median shorter side {found.median_shorter:g} px -> size {size}."
        )
    else:
        head.append(f"# No sampled image header was readable: size {size} is a guess.")
    if found.unreadable:
        head.append(f"# {found.unreadable} sampled file(s) could not be read: expect rejects.")
    return head


def _source_lines(found: Survey, base: Path) -> list[str]:
    source = FolderSource(path=found.root)
    return [
        "source:",
        _kv(2, "kind", source.kind, "one sub-folder per class; or listing (CSV/Parquet)"),
        _kv(2, "path", _relative(found.root, base), "relative to this file"),
        _kv(2, "include", list(source.include), "fnmatch on the relative path, any case"),
        _kv(2, "exclude", list(source.exclude), 'e.g. ["*/_drafts/*"]'),
        "  # classes fixes the label order (default: sorted folder names); uncomment to pin it:",
        *_wrapped_comment("  # classes: ", list(found.classes)),
        _kv(
            2,
            "max_file_bytes",
            _byte_size(source.max_file_bytes),
            "larger files are rejected without being read",
        ),
        _kv(2, "io_timeout", source.io_timeout, "seconds a file's read may take; then rejected"),
        _kv(2, "storage_options", {}, "for a path in object storage: its fsspec options"),
        _kv(2, "allow_protocols", [], "besides s3, gs, az...: e.g. [http]; nothing else is read"),
        "  split:                  # fractions by a hash of the path; the rest is train",
        *[_kv(4, k, v) for k, v in source.split.items()],
    ]


def _stage_lines(found: Survey) -> list[str]:
    decode = DecodeStage(mode="L" if found.grey else "RGB")
    validate = ValidateStage()
    resize = ResizeStage(size=(found.size, found.size))
    return [
        "stages:                   # decode first, resize required; validate and call optional",
        "  - decode:",
        _kv(
            6,
            "mode",
            decode.mode,
            _choices(DecodeStage, "mode", decode.mode, prefix="")
            + (" (every sampled image is grey)" if found.grey else ""),
        ),
        _kv(6, "background", list(decode.background), "alpha is composited onto this colour"),
        _kv(6, "max_pixels", decode.max_pixels, "decompression-bomb guard"),
        _kv(
            6,
            "multi_frame",
            decode.multi_frame,
            _choices(DecodeStage, "multi_frame", decode.multi_frame) + " (animations, multi-page)",
        ),
        _kv(6, "formats", list(decode.formats), "Pillow formats decoded; others are rejected"),
        _kv(
            6,
            "allow_external_programs",
            decode.allow_external_programs,
            "true lets formats: [EPS] run Ghostscript: unsafe",
        ),
        "  - validate:",
        _kv(6, "min_size", validate.min_size, "e.g. [32, 32]: refuse smaller sources (HxW)"),
        _kv(6, "max_aspect", validate.max_aspect, "e.g. 4.0: refuse long thin sources"),
        _kv(
            6,
            "duplicates",
            validate.duplicates,
            _choices(ValidateStage, "duplicates", validate.duplicates) + " (same content hash)",
        ),
        "  - resize:",
        _kv(6, "size", list(resize.size or ()), "stored [height, width] (suggested, see above)"),
        _kv(6, "mode", resize.mode, _choices(ResizeStage, "mode", resize.mode)),
        _kv(6, "filter", resize.filter, _choices(ResizeStage, "filter", resize.filter)),
        _kv(6, "fill", list(resize.fill), "letterbox colour of mode pad"),
        "      # draft: false          # exact JPEG decode (default: at 1/2-1/8 scale where that",
        "      #                       # keeps 2x the output; a fraction of a big photo's decode)",
        "      # or keep each image's aspect ratio (instead of size; docs/configuration.md):",
        "      # mode: keep_aspect, shorter: 256, longer: 512, upscale: false",
        '  # - call: {function: "mypackage.module:function", options: {}}   # fn(array) -> array',
    ]


def _output_lines(output_dir: Path, base: Path) -> list[str]:
    output = OutputConfig()
    return [
        "output:",
        _kv(
            2,
            "dir",
            _relative(output_dir, base),
            "relative to this file, outside source.path; or s3://bucket/prefix",
        ),
        _kv(2, "storage_options", {}, "for a dir in object storage: its fsspec options"),
        _kv(2, "store_timeout", output.store_timeout, "seconds one call to that store may take"),
        _kv(
            2,
            "shard_size",
            _byte_size(SHARD_BYTES),
            "the default; or set samples_per_shard instead",
        ),
        _kv(2, "samples_per_shard", output.samples_per_shard, "rows per shard, e.g. 1000"),
        _kv(2, "layout", output.layout, _choices(OutputConfig, "layout", output.layout)),
        _kv(2, "checksum", output.checksum, _choices(OutputConfig, "checksum", output.checksum)),
        _kv(2, "codec", "raw", "raw rows; jpeg (a tenth of the bytes) or zlib (exact)"),
        "  # codec: {kind: jpeg, quality: 90, min_ratio: 1.0}   # raw where jpeg saves < min_ratio",
    ]


def _run_lines() -> list[str]:
    run = RunConfig()
    return [
        "run:                      # does not change the output",
        _kv(2, "n_jobs", run.n_jobs, "-1: every core; --jobs overrides"),
        _kv(
            2,
            "backend",
            run.backend,
            _choices(RunConfig, "backend", run.backend) + "; --backend overrides",
        ),
        _kv(2, "address", run.address, "dask scheduler, e.g. tcp://10.0.0.5:8786"),
    ]


def _choices(model: type[BaseModel], key: str, chosen: str, prefix: str = "or ") -> str:
    """The other values a Literal key of `model` accepts, read from the model: "or a, b"."""
    others = [v for v in get_args(model.model_fields[key].annotation) if v != chosen]
    return prefix + ", ".join(others) if prefix else " or ".join([chosen, *others])


def _byte_size(n: int) -> str | int:
    """Bytes as the config writes them: '512MiB' where a binary unit divides them."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return n


def _wrapped_comment(prefix: str, values: list[str], width: int = 100) -> list[str]:
    """A flow list cut into comment lines that, uncommented together, are still valid YAML."""
    lines, current = [], prefix + "["
    indent = prefix[: prefix.index("#") + 1] + "   "  # uncommented: deeper than the key
    for i, value in enumerate(values):
        item = yaml_value(value) + ("]" if i == len(values) - 1 else ",")
        if len(current) + len(item) + 1 > width and not current.endswith("["):
            lines.append(current)
            current = indent + item
        else:
            current += ("" if current.endswith("[") else " ") + item
    return [*lines, current]


def write(path: Path | str, text: str, force: bool = False) -> Path:
    """Write `text` to `path` through a temp file and a rename; refuse to replace an existing
    file unless `force`."""
    path = Path(path)
    if path.exists() and not force:
        raise EtlError(f"{path}: exists already; pass --force to overwrite it")
    if path.is_dir():
        raise EtlError(f"{path}: is a folder; give the path of the YAML file to write")
    if not path.parent.is_dir():
        raise EtlError(f"{path.parent}: no such folder")
    with replacing(path) as temp:
        temp.write_text(text, encoding="utf-8")
    return path
