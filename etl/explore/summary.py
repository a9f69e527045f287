"""One version of a dataset in numbers, as `etl inspect` shows it and `--json` writes it:
counts per split and class, shards, rejects by reason, the output config, the columns, and
how the samples are stored (codec, stored and raw bytes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from etl.format.coherence import RAGGED_COLUMNS
from etl.format.contents import VersionContents
from etl.format.flat import channels_of


def summarize(contents: VersionContents, location: str, versions: list[int]) -> Summary:
    """`contents` (a version opened) in numbers; `location` is where it was opened from and
    `versions` every version committed there."""
    meta = contents.manifest.meta
    reasons = Counter(contents.rejects.column("reason").to_pylist())
    return Summary(
        root=location,
        version=contents.version,
        versions=versions,
        created=meta.created,
        tool_version=meta.tool_version,
        format_version=meta.format_version,
        samples=len(contents),
        classes=list(contents.classes),
        splits=list(contents.splits),
        counts=contents.counts(),
        shards=contents.shards.num_rows,
        shard_bytes=int(pc.sum(contents.shards.column("bytes")).as_py() or 0),
        rejects=contents.rejects.num_rows,
        rejects_by_reason=dict(sorted(reasons.items())),
        checksum=meta.checksum,
        layout=meta.layout,
        sample_shape=list(meta.sample_shape),
        dtype=meta.dtype,
        config_digest=meta.config_digest,
        config=dict(meta.config),
        columns={
            name: {
                "type": text,
                "values": contents.table.num_rows - contents.table[name].null_count,
            }
            for name, text in meta.columns
        },
        storage=_storage(contents),
    )


def _storage(contents: VersionContents) -> dict[str, Any]:
    """How samples are stored: the codec, samples per codec, stored and raw bytes."""
    meta, table = contents.manifest.meta, contents.table
    channels = channels_of(meta.sample_shape, meta.layout)
    if meta.ragged:
        sides = (table.column(c).to_numpy().astype(np.int64) for c in RAGGED_COLUMNS[1:])
        raw = int(np.prod(np.stack(list(sides)), axis=0).sum()) * channels
    else:
        raw = len(contents) * int(np.prod(meta.sample_shape))
    if not meta.encoded:
        return {
            "codec": {"kind": "raw"},
            "samples": {"raw": len(contents)},
            "bytes": raw,
            "raw_bytes": raw,
        }
    counts = Counter(table.column("sample_codec").to_pylist())
    stored = int(pc.sum(table.column("sample_bytes")).as_py() or 0)
    return {
        "codec": dict(meta.codec or {}),
        "samples": dict(sorted(counts.items())),
        "bytes": stored,
        "raw_bytes": raw,
    }


@dataclass(frozen=True)
class Summary:
    """One version of a dataset in numbers; `to_dict()` is `etl inspect --json`."""

    root: str
    version: int
    versions: list[int]
    created: str
    tool_version: str
    format_version: int
    samples: int
    classes: list[str]
    splits: list[str]
    counts: dict[str, dict[str, int]]
    """{split: {class: samples}}"""
    shards: int
    shard_bytes: int
    """Bytes of the shard files this version references, headers included."""
    rejects: int
    rejects_by_reason: dict[str, int]
    checksum: str
    layout: str
    sample_shape: list[int]
    dtype: str
    config_digest: str
    config: dict[str, Any]
    """The output-shaping config (stages, layout, checksum, split) the version was packed with."""
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-sample columns: {name: {type (as pipeline.yaml writes it), values (not null)}}."""
    storage: dict[str, Any] = field(default_factory=dict)
    """How samples are stored: {codec: output.codec, samples: {codec: count}, bytes: stored
    bytes of the samples, raw_bytes: their pixels' bytes}."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))
