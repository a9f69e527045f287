"""Writing a file so that a reader sees the old one or the whole new one, never half of it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etl.errors import OutputError, described


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path` to write; on success it is renamed over `path`, on any
    failure it is removed and `path` is untouched; an OSError on the way (a missing or
    read-only folder, a full disk) is an OutputError naming `path`. The temp name starts with
    `.tmp-`, which `etl.format.commit.clean_leftovers` collects inside a dataset."""
    temp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        yield temp
        os.replace(temp, path)
    except OSError as exc:  # a missing or read-only folder, a full disk: the user's to fix
        raise OutputError(f"{path}: cannot write it ({described(exc)})") from None
    finally:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
