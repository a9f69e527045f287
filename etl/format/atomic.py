"""Writing a file so that a reader sees the old one or the whole new one, never half of it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path` to write; on success it is renamed over `path`, on any
    failure it is removed and `path` is untouched. The temp name starts with `.tmp-`, which
    `etl.format.commit.clean_leftovers` collects inside a dataset."""
    temp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        yield temp
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
