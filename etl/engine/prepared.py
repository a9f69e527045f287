"""Samples decoded in the hash phase, kept on the scratch disk for the pack phase (#60).

Packing from a store costs the GETs and then the decode: the plan needs every content hash
before it decides what to pack, so no shard is filled while objects are still arriving. But
the hashing worker holds each object it keeps (`etl.sources.kept`) and its CPU waits on the
store, so it decodes the object there and then, while its read-ahead threads fetch the next
ones, and keeps the finished sample (or the reject) beside the object, tagged with the content
hash of the bytes it was made from. The pack phase writes a kept sample whose hash is the one
the plan recorded, and decodes anything else as before. A duplicate, or an object whose bytes
the last version already holds, was decoded for nothing: a store's objects are hashed only
when new or changed, so that is rare.

The file: one line of JSON (`hash`, then `codec`, `shape`, `stored_shape`, `height`, `width`;
or `reject`: [reason, message]), a newline, and the stored bytes. Plain data, no pickle; a file
that does not parse is not used (the object is read again).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.images.rejects import Reject

SUFFIX = ".sample"
MAX_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Prepared:
    """One source's sample, ready for a shard: the row as stored (raw pixels in the stored
    shape, or encoded bytes), the decoded sample's shape, its codec and the source's size."""

    stored: NDArray[np.uint8]
    shape: tuple[int, ...]
    codec: str
    height: int
    width: int


def prepared_path(object_path: Path) -> Path:
    """Where the sample made from a kept object (at `object_path`) is kept."""
    return object_path.with_name(object_path.name + SUFFIX)


def write_prepared(path: Path, content_hash: str, outcome: Prepared | Reject) -> None:
    """Keep `outcome` at `path` (a temp name, then a rename: a file there is whole)."""
    header: dict[str, Any] = {"hash": content_hash}
    if isinstance(outcome, Reject):
        header["reject"] = [outcome.reason, outcome.message]
        body = b""
    else:
        header |= {
            "codec": outcome.codec,
            "shape": list(outcome.shape),
            "stored_shape": list(outcome.stored.shape),
            "height": outcome.height,
            "width": outcome.width,
        }
        body = np.ascontiguousarray(outcome.stored).tobytes()
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            f.write(json.dumps(header).encode() + b"\n")
            f.write(body)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def take_prepared(path: Path) -> tuple[str, Prepared | Reject] | None:
    """(content hash, sample or reject) kept at `path`, removed from the disk; None where
    there is none, or what is there does not parse (the caller decodes the object again)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    head, newline, _ = data[:MAX_HEADER_BYTES].partition(b"\n")
    if not newline:
        return None
    try:
        header = json.loads(head)
        content_hash = str(header["hash"])
        if "reject" in header:
            reason, message = header["reject"]
            return content_hash, Reject(str(reason), str(message))
        stored_shape = tuple(int(n) for n in header["stored_shape"])
        stored = np.frombuffer(data, np.uint8, offset=len(head) + 1).reshape(stored_shape)
        shape = tuple(int(n) for n in header["shape"])
        height, width = int(header["height"]), int(header["width"])
        return content_hash, Prepared(stored, shape, str(header["codec"]), height, width)
    except (ValueError, KeyError, TypeError):
        return None
