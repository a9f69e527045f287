"""How a worker gets an input's bytes from its locator (`SourceFile.path`), whatever its kind.

The registry's kinds list what exists and write locators; this module reads them back, in a
worker process or a Dask worker, through the `SourceSpec` the parent made of the config
(`etl.sources.registry.spec_of`: plain data, so a worker never imports the config models),
with what each kind's `read` does:

    folder, listing   locator = a file path                  -> the file's bytes
    lmdb              locator = the key as `source` spells it -> the value (or its image field)
                      (NOTE [names] in etl/format/names.py)
    python, parquet   locator = "<offset>+<length>@<spool>"   -> that slice of the spool file
    webdataset        locator = "<offset>+<length>@<tar>"     -> the member, read in place
                      (a compressed tar's members are spooled)

Reader errors are OSError: the executor turns them into `io_error` rejects, or into the reason a
`Refused` carries (`not_a_file`, `file_too_large`, `io_timeout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path

from etl.format.checksums import digest
from etl.sources.in_store import located_digest, read_located
from etl.sources.kind import SourceSpec
from etl.sources.safe_files import Refused
from etl.sources.spool import NOT_SPOOLED, SpoolWriter, spool_path
from etl.sources.timed import OBJECTS_IN_FLIGHT, file_outcomes, outcomes
from etl.storage.location import StoreUrl

__all__ = [
    "NOT_SPOOLED",
    "Refused",
    "SourceSpec",
    "SpoolWriter",
    "digest_many",
    "read",
    "read_many",
    "spool_path",
]


def read(source: SourceSpec, locator: str) -> bytes:
    """The bytes of one input; OSError (with the locator in the message) if it cannot be read."""
    return source.read(source.config, locator)


def read_many(
    source: SourceSpec, locators: Iterable[str], keep: Path | None = None
) -> Iterator[bytes | OSError]:
    """`read` of each locator, in order: its bytes, or the OSError it raised. Files are read
    ahead of the caller (NOTE [ read ahead ] in etl/sources/timed.py); an object the hash
    phase kept in `keep` is read from there (`etl.sources.kept`)."""
    config = source.config
    if source.by_path:
        read_file = partial(read_located, options=config.storage_options, keep=keep)
        return file_outcomes(config, locators, read_file)
    return outcomes(partial(source.read, config, locator) for locator in locators)


def digest_many(
    source: SourceSpec,
    locators: Iterable[str],
    algorithm: str,
    sizes: Mapping[str, int] | None = None,
    keep: Path | None = None,
) -> Iterator[str | OSError]:
    """The content hash of each input, as `digest(read(...))` gives it, in order, or the
    OSError its read raised; files are streamed and read ahead, never held whole. `sizes`:
    the listed size of a file by locator, which an object in a store must have (a shorter
    body is an OSError) and which spares asking the store for it. `keep`: a folder where
    objects are kept for `read_many` to read again without a GET (`etl.sources.kept`)."""
    config = source.config
    if source.by_path:
        listed = sizes or {}

        def hash_file(path: str, max_bytes: int) -> str:
            size = listed.get(path)
            return located_digest(path, algorithm, max_bytes, config.storage_options, size, keep)

        path = getattr(config, "path", None)
        in_flight = OBJECTS_IN_FLIGHT if isinstance(path, StoreUrl) else 1
        return file_outcomes(config, locators, hash_file, in_flight)
    return (
        data if isinstance(data, OSError) else digest(data, algorithm)
        for data in read_many(source, locators)
    )
