"""Checksum algorithms by name: one registry for source hashes, sample checksums and shard digests.

All digests are lowercase hex strings, so the manifest reads the same in pandas or duckdb.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial
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


HEX_LENGTH: dict[str, int] = {name: len(make().hexdigest()) for name, make in HASHERS.items()}
"""Hex digits of each algorithm's digest: what a manifest's checksum columns must hold."""

ROW_DIGESTS: dict[str, Callable[[Any], str]] = {
    "xxh3_64": xxhash.xxh3_64_hexdigest,
    "xxh3_128": xxhash.xxh3_128_hexdigest,
}
"""One-call digests for hot per-row loops; the other algorithms go through `digest`."""


def row_digest(algorithm: str) -> Callable[[Any], str]:
    """The fastest function giving `digest(data, algorithm)` for one sample."""
    return ROW_DIGESTS.get(algorithm) or partial(digest, algorithm=algorithm)


RAW_DIGESTS: dict[str, Callable[[Any], bytes]] = {
    "xxh3_64": xxhash.xxh3_64_digest,
    "xxh3_128": xxhash.xxh3_128_digest,
}
"""`ROW_DIGESTS` as bytes (the hex digest's bytes: `raw(data).hex() == digest(data)`)."""


def raw_digest(algorithm: str) -> Callable[[Any], bytes]:
    """The fastest function giving `bytes.fromhex(digest(data, algorithm))` for one sample:
    what a row read is compared with, 8 bytes a sample kept for xxh3_64 instead of a string."""
    return RAW_DIGESTS.get(algorithm) or partial(_raw, algorithm=algorithm)


def _raw(data: Any, algorithm: str) -> bytes:
    return bytes.fromhex(digest(data, algorithm))


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


READ_CHUNK = 4 << 20
"""Bytes read at a time by `file_digests`."""


def file_digests(
    path: Path, algorithms: tuple[str, ...], all_cores: bool = False
) -> tuple[str, ...]:
    """Digests of a whole file in one pass, read in READ_CHUNK pieces into one reused buffer.
    `all_cores` hashes BLAKE3 on every core (the same digest; a 1.7 GB manifest in 0.21 s
    instead of 0.28 s on 2 cores): for a caller that is alone, not a worker among many.

    NOTE: not an mmap: every page of a mapped file counts in the process's resident memory, so
    hashing a 256 MiB shard that way added 256 MiB to a worker's peak RSS. The copy out of the
    page cache costs little next to the hashing: 152 against 122 ms per 256 MiB for xxh3_64 and
    blake3 together (benchmarks/pack/throughput.py machine), 0.02 ms per 224x224x3 sample.
    """
    hashers = [
        blake3.blake3(max_threads=blake3.blake3.AUTO)
        if all_cores and a == "blake3"
        else new_hasher(a)
        for a in algorithms
    ]
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            chunk = view[:n]
            for h in hashers:
                h.update(chunk)
    return tuple(h.hexdigest() for h in hashers)
