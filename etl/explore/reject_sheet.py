"""Reject sheets: the thumbnail of each rejected source, read back the way a run reads it (any
source kind, through `etl.sources.locate` and `readers`), or a placeholder that says why there
is none."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from etl.explore.drawing import Cell

if TYPE_CHECKING:
    from etl.config import DecodeStage, SourceConfig  # NOTE: pydantic costs 0.25 s to import

MAX_REJECT_BYTES = 256 << 20
"""A rejected file larger than this is not read for its thumbnail (a placeholder says so)."""


def reject_cells(
    source: SourceConfig,
    rejects: Sequence[Mapping[str, Any]],
    decode: DecodeStage,
    checksum: str,
    root: Path | None = None,
) -> list[Cell]:
    """The cells of rows of rejects.arrow, in order. Their sources are located again (`root`:
    where the source is now, when it moved; a record source is listed again, its rejected
    records spooled to a temporary file) and read as a run reads them: never outside the source
    root, never a FIFO, never more than MAX_REJECT_BYTES. `checksum`: the manifest's algorithm
    of `source_hash`."""
    from etl.sources import readers
    from etl.sources.entries import ListContext
    from etl.sources.locate import locate
    from etl.sources.registry import released, spec_of

    limit = min(source.max_file_bytes, MAX_REJECT_BYTES)
    source = source.model_copy(update={"max_file_bytes": limit})
    names = [str(r["source"]) for r in rejects]
    hashes = frozenset(str(r["source_hash"]) for r in rejects if r.get("source_hash"))
    with (
        tempfile.TemporaryDirectory(prefix="etl-rejects-") as scratch,
        released(None),
    ):
        context = ListContext(checksum, spool=Path(scratch) / "spool.bin", wanted=hashes)
        found = locate(source, set(names), context, root)
        located = [n for n in names if n in found.locators]
        outcomes = readers.read_many(spec_of(source), [found.locators[n] for n in located])
        data = dict(zip(located, outcomes, strict=True))  # read now, while the spool exists
    return [
        _cell(row, data[name] if name in data else found.missing[name], decode)
        for name, row in zip(names, rejects, strict=True)
    ]


def _cell(reject: Mapping[str, Any], data: bytes | OSError | str, decode: DecodeStage) -> Cell:
    """One reject's thumbnail from its bytes, or a placeholder saying why there is none."""
    from etl.images.decode import decode as decode_image
    from etl.images.recipe import decode_step
    from etl.images.rejects import Reject

    source, reason = str(reject["source"]), str(reject["reason"])
    info = {"source": source, "reason": reason, "message": reject["message"], "decoded": False}
    caption = (reason, PurePosixPath(source).name)
    why = None
    if isinstance(data, OSError):
        why = data.strerror or str(data)
    elif isinstance(data, str):
        why = data
    else:
        try:
            image = decode_image(data, decode_step(decode)).image
        except Reject as exc:
            why = str(exc)
    if why is not None:
        return Cell(None, caption, {**info, "note": why}, placeholder=f"{reason}: {why}")
    return Cell(image, caption, {**info, "decoded": True})
