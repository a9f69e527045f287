"""Reject sheets: the thumbnail of a rejected source file, read from inside its source root,
or a placeholder that says why there is none."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from etl.explore.drawing import Cell
from etl.format import names
from etl.sources import readers

if TYPE_CHECKING:
    from etl.config import DecodeStage  # NOTE: pydantic costs 0.25 s to import

# --- rejected sources -------------------------------------------------------------------------

MAX_REJECT_BYTES = 256 << 20
"""A rejected file larger than this is not read for its thumbnail (a placeholder says so)."""


def reject_cell(source_root: Path, reject: Mapping[str, Any], decode: DecodeStage) -> Cell:
    """The cell of one row of rejects.arrow: its thumbnail, or a placeholder saying why not."""
    from etl.images.rejects import Reject
    from etl.images.stages import decode as decode_image

    source, reason = str(reject["source"]), str(reject["reason"])
    info = {"source": source, "reason": reason, "message": reject["message"], "decoded": False}
    caption = (reason, PurePosixPath(source).name)
    try:
        data = _read_inside(source_root, source)
        image = decode_image(data, decode).image
    except (OSError, _Outside) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Cell(None, caption, {**info, "note": why}, placeholder=f"{reason}: {why}")
    except Reject as exc:
        return Cell(None, caption, {**info, "note": str(exc)}, placeholder=str(exc))
    return Cell(image, caption, {**info, "decoded": True})


class _Outside(Exception):
    pass


def _read_inside(root: Path, source: str) -> bytes:
    """Bytes of the file `source` names under `root`, refusing paths (or links) that lead
    outside `root`, anything but a regular file (never opened: reading a FIFO would block) and
    files above MAX_REJECT_BYTES."""
    try:
        path = names.source_path(root, source)
    except ValueError:
        raise _Outside("path outside the source root") from None
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise _Outside("link leads outside the source root")
    kind = readers.not_a_file(os.stat(path))
    if kind is not None:
        raise _Outside(f"{kind}, not a regular file")
    try:
        return readers.read_regular_file(path, MAX_REJECT_BYTES)
    except readers.Refused as exc:
        raise _Outside(str(exc)) from None
