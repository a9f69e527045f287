"""What a repair worker does for one new shard: the verified rows of a damaged shard copied as
they are (their bytes checked again), then the sources of the bad samples decoded again through
the run's stages (`etl.engine.fill`); and the plain data it is sent and sends back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.config import PipelineConfig
from etl.engine.fill import fill_shard, fill_spec
from etl.errors import ShardError
from etl.format.checksums import row_digest
from etl.format.flat import Encoding, Place, sides_of, stored_bytes
from etl.format.shards import ShardInfo, ShardWriter, open_shard
from etl.images.rejects import READ_REJECTS, Reject
from etl.sources.locate import CHANGED

Placed = tuple[Place, Encoding | None]
"""Where a repaired sample of a flat shard went, and how it is stored there."""


@dataclass(frozen=True)
class RepairItem:
    """One sample to store again: decoded from its source, or copied from its damaged shard."""

    sample_id: str
    source: str
    source_hash: str
    old_shard: str
    old_shard_rows: int
    old_row: int
    expected: str
    """The manifest's checksum of the sample."""
    copy: bool
    """True: its row verified, but its shard is damaged elsewhere: copy the verified bytes."""
    locator: str | None = None
    """Where `readers` reads its source (`etl.sources.locate`); None: copy only."""
    old_place: Place | None = None
    """In a flat shard (format versions 2 and 3), its place in the damaged shard."""
    old_encoding: Encoding | None = None
    """Stored encoded (format version 3), its stored bytes and codec."""


@dataclass(frozen=True)
class RepairTask:
    shard: str
    items: tuple[RepairItem, ...]


@dataclass(frozen=True)
class RepairOutcome:
    shard: ShardInfo | None
    stored: tuple[tuple[str, int, str, str, Placed | None], ...]
    """(sample_id, new row, checksum, how, new place and encoding in a flat shard) with how
    "copied" or "decoded"."""
    failed: tuple[tuple[str, str], ...]
    """(sample_id, why it cannot be repaired)."""


def repair_shard(
    task: RepairTask,
    config: PipelineConfig,
    root: str,
    sample_shape: tuple[int, ...],
) -> RepairOutcome:
    """Worker: write one new shard from `task.items`: the verified rows it copies first, then
    the sources it decodes again (`etl.engine.fill.fill_shard`, as a run fills a shard)."""
    one_row = row_digest(config.output.checksum)
    opened: dict[str, np.memmap] = {}
    stored: list[tuple[str, int, str, str, Placed | None]] = []
    layout = config.output.layout

    def place(row: int, sides: tuple[int, int], encoding: Encoding | None) -> Placed | None:
        if not writer.flat:
            return None
        return (writer.placed[row][0], *sides), encoding

    failed: list[tuple[str, str]] = []
    writer = ShardWriter(
        Path(root), task.shard, len(task.items), config.stored_shape, config.output.checksum
    )
    with writer:
        decode: list[RepairItem] = []
        for item in task.items:
            pixels = _copy(item, Path(root), sample_shape, layout, opened, one_row)
            if pixels is not None:
                row, checksum = writer.append(pixels)
                sides = item.old_place[1:] if item.old_place is not None else (0, 0)
                kept = place(row, sides, item.old_encoding)
                stored.append((item.sample_id, row, checksum, "copied", kept))
            elif item.locator is None:
                failed.append((item.sample_id, "its row fails its check and its source is gone"))
            else:
                decode.append(item)
        opened.clear()
        sources = [(i.source, i.locator or "", i.source_hash) for i in decode]
        filled = fill_shard(writer, fill_spec(config), sources, CHANGED)
        for item, outcome in zip(decode, filled, strict=True):
            if isinstance(outcome, Reject):
                failed.append((item.sample_id, _why(outcome)))
            else:
                sides = sides_of(outcome.shape, layout)
                encoding = (outcome.nbytes, outcome.codec) if item.old_encoding else None
                new = place(outcome.row, sides, encoding)
                stored.append((item.sample_id, outcome.row, outcome.checksum, "decoded", new))
        info = writer.finish()
    return RepairOutcome(info, tuple(stored), tuple(failed))


def _why(reject: Reject) -> str:
    """Why a sample could not be decoded again, in words."""
    if reject.reason == "changed":
        return f"source {reject.message}"
    if reject.reason in READ_REJECTS:
        return f"source cannot be read ({reject.reason}: {reject.message})"
    return f"the stages now reject the source ({reject})"


def _copy(
    item: RepairItem,
    root: Path,
    sample_shape: tuple[int, ...],
    layout: str,
    opened: dict[str, np.memmap],
    one_row: Callable[[Any], str],
) -> NDArray[np.uint8] | None:
    """The verified stored bytes of a good sample in a damaged shard; None to decode instead."""
    if not item.copy:
        return None
    if item.old_shard not in opened:
        try:
            stored_shape = (0,) if item.old_encoding is not None else sample_shape
            opened[item.old_shard] = open_shard(
                root / item.old_shard, stored_shape, item.old_shard_rows
            )
        except (ShardError, OSError):
            return None
    try:
        pixels = stored_bytes(
            opened[item.old_shard],
            item.old_row,
            item.old_place,
            sample_shape,
            layout,
            item.old_encoding,
        )
    except ValueError:
        return None
    return pixels if one_row(np.ascontiguousarray(pixels).data.cast("B")) == item.expected else None
