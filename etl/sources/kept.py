"""Objects kept from the hash phase for the pack phase: one GET per object from a store.

A run hashes every new object (to decide what to pack) and then decodes the ones it packs:
two reads, and from a store two GETs, the second of which cost half of packing from a bucket
(`pack.from_store`: 0.17x of local disk). So while a worker hashes an object it also writes
the bytes to a file of the run's scratch folder, named by the object's URL, and the pack
phase reads that file (and removes it) instead of asking the store again. What it reads is
checked against the content hash the plan recorded, as every read is, so a kept file is never
trusted more than the store.

Bounded: an object is kept only while the scratch disk keeps `FREE_MARGIN` of itself free
after it (and a kept file is removed once packed, the rest with the scratch folder at the end
of the run); past that, or on a Dask cluster (whose workers do not share this disk), the pack
phase reads from the store as before. Nothing is held in memory: the bytes go to the file a
hashing chunk at a time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import xxhash

FREE_MARGIN = 0.10
"""Keep an object only while at least this share of the scratch disk stays free after it."""
MIN_FREE_BYTES = 1 << 30
"""... and at least this many bytes."""


def kept_path(folder: Path, url: str) -> Path:
    """Where the object at `url` is kept in `folder` (the same for the hashing worker and the
    packing one, whichever process each is)."""
    return folder / xxhash.xxh3_128_hexdigest(url.encode())


def room_for(folder: Path, size: int | None) -> bool:
    """Whether `size` more bytes leave the disk of `folder` its free margin."""
    if size is None:
        return False
    usage = shutil.disk_usage(folder)
    return usage.free - size >= max(MIN_FREE_BYTES, FREE_MARGIN * usage.total)


def keeping(chunks: Iterable[bytes], path: Path) -> Iterator[bytes]:
    """`chunks` as they come, also written to `path`, which exists only once all of them
    were (a temp name, then a rename): an object cut short, refused or failing is not kept."""
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                yield chunk
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def take(folder: Path, url: str) -> bytes | None:
    """The kept bytes of `url`, removed from the folder (None: not kept, read the store)."""
    path = kept_path(folder, url)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    return data
