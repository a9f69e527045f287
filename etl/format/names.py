"""How an input's raw name (file path bytes, LMDB key) is spelt as the manifest's `source` string.

NOTE [names]: a file system allows any bytes but '/' and NUL in a name; Arrow strings, JSON and a
terminal want printable UTF-8. One rule, shared by every source kind:
- a name whose bytes are UTF-8 text of printable characters (no newline, tab or other control
  character), and that does not itself start with 'hex:', is its own `source`;
- any other name is 'hex:' + its bytes in lowercase hex.
The mapping is one-to-one and depends on the name alone, so `source` and `sample_id` are stable
across runs and machines. Backslashes, spaces, leading dashes and any printable Unicode stay as
they are. For files the name is the path relative to the source root, '/'-separated.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

HEX_PREFIX = "hex:"


def to_source(raw: bytes) -> str:
    """A raw name (path bytes relative to the root, or an LMDB key) -> its `source` string."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return HEX_PREFIX + raw.hex()
    if not text.isprintable() or text.startswith(HEX_PREFIX):
        return HEX_PREFIX + raw.hex()
    return text


def to_raw(source: str) -> bytes:
    """The inverse of `to_source`; ValueError for 'hex:' followed by anything but hex digits."""
    if source.startswith(HEX_PREFIX):
        try:
            return bytes.fromhex(source[len(HEX_PREFIX) :])
        except ValueError:
            raise ValueError(f"{source!r} starts with 'hex:' but is not hex digits") from None
    return source.encode("utf-8")


def path_to_source(relative: str) -> str:
    """A path relative to the root as `os` gives it (undecodable bytes as surrogates) -> source."""
    if relative.isprintable() and not relative.startswith(HEX_PREFIX):
        return relative  # the common case, without encoding (a surrogate is not printable)
    return to_source(os.fsencode(relative))


def is_inside(source: str) -> bool:
    """True when `source` names a path inside its root: relative, non-empty, no '..' part, no
    NUL. Checked on the raw bytes, so a 'hex:' name cannot hide an escape."""
    try:
        raw = to_raw(source)
    except ValueError:
        return False
    parts = raw.split(b"/")
    return bool(raw) and not raw.startswith(b"/") and b".." not in parts and b"\0" not in raw


def source_path(root: Path | str, source: str) -> str:
    """The file `source` names under `root`, as an `os` path string; ValueError when `source`
    is not a path inside the root (see `is_inside`)."""
    if not is_inside(source):
        raise ValueError(f"source {source!r} is not a path inside the source root")
    return os.path.join(os.fspath(root), os.fsdecode(to_raw(source)))


def sample_id(source: str) -> str:
    """A sample's id: 16 hex digits of xxh3_64 of its `source` (the same source, the same id)."""
    return xxhash.xxh3_64_hexdigest(source.encode("utf-8"))
