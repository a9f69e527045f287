"""The spool: records that reach the workers through one file in the output folder.

NOTE [spool]: a Python source's records exist only while its function runs, in the parent;
tar shards and tables are read there in one pass, record by record (a tar has no index to find
one record by). Those a run must pack go into one file, `<output>/shards/.tmp-spool-<pid>.bin`,
and workers pread their slice (locator "<offset>+<length>@<spool>"). It lives in the output
folder because every worker (also on a Dask cluster) sees it; the pipeline deletes it at the end
of a run, and a killed run's spool is removed by the next run's `clean_leftovers` like any other
`.tmp-*` file under shards/. An uncompressed tar's members are read the same way, in place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from etl.format.shards import SHARDS_DIR

SPOOL_PREFIX = ".tmp-spool-"
"""The name every spool file starts with (NOTE [spool])."""


def spool_path(root: Path) -> Path:
    """This process's spool file in the dataset at `root`."""
    return root / SHARDS_DIR / f"{SPOOL_PREFIX}{os.getpid()}.bin"


NOT_SPOOLED = "not-spooled"
"""Locator of a record whose content was already stored when it was listed: never read."""


class SpoolWriter:
    """Appends records to a spool file and hands back their locators. Closed before the pack
    phase starts, so workers (also over NFS, by close-to-open consistency) see every byte."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 -- closed by close()
        self._offset = 0

    def append(self, data: bytes | memoryview) -> str:
        self._file.write(data)
        locator = f"{self._offset}+{len(data)}@{self.path}"
        self._offset += len(data)
        return locator

    def close(self) -> None:
        self._file.close()


def read_slice(config: Any, locator: str) -> bytes:
    """`length` bytes at `offset` of a file (the spool, or an uncompressed tar)."""
    span, at, spool = locator.partition("@")
    if not at:
        raise OSError(f"record {locator!r} was not spooled: its content was stored already")
    offset, length = (int(n) for n in span.split("+"))
    fd = os.open(spool, os.O_RDONLY)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise OSError(f"spool {spool} ends at {offset + len(data)}, before {offset + length}")
    return data
