"""Checksum algorithms by name: one registry for source hashes, sample checksums and shard digests.

All digests are lowercase hex strings, so the manifest reads the same in pandas or duckdb.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import blake3
import xxhash


class Hasher(Protocol):
    def update(self, data: Any, /) -> Any: ...
    def hexdigest(self) -> str: ...


HASHERS: dict[str, Callable[[], Hasher]] = {
    "xxh3_64": xxhash.xxh3_64,
    "xxh3_128": xxhash.xxh3_128,
    "blake3": blake3.blake3,
    "sha256": hashlib.sha256,
}
"""xxh3 runs faster than a memory copy; blake3 and sha256 are cryptographic (tamper evidence)."""

TAMPER_DIGEST = "blake3"
"""Every shard also gets this cryptographic digest, whatever `output.checksum` is."""


def new_hasher(algorithm: str) -> Hasher:
    try:
        return HASHERS[algorithm]()
    except KeyError:
        raise ValueError(
            f"unknown checksum {algorithm!r}; expected one of {', '.join(HASHERS)}"
        ) from None


def digest(data: Any, algorithm: str) -> str:
    """Hex digest of a bytes-like object (a C-contiguous numpy array works without a copy)."""
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def file_digests(path: Path, algorithms: tuple[str, ...]) -> tuple[str, ...]:
    """Digests of a whole file in one pass over an mmap (no copy into Python memory)."""
    hashers = [new_hasher(a) for a in algorithms]
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return tuple(h.hexdigest() for h in hashers)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                step = 64 << 20
                for start in range(0, len(view), step):
                    chunk = view[start : start + step]
                    for h in hashers:
                        h.update(chunk)
                    chunk.release()
            finally:
                view.release()
    return tuple(h.hexdigest() for h in hashers)
