"""List the rows of tables of encoded images: Parquet files, and Arrow IPC files or streams (the
layouts of image datasets on the Hugging Face Hub). The rules every container shares (what
`source` is, NOTE [hostile containers]) are in `etl.sources.containers`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from etl.config import ParquetSource
from etl.errors import SourceError
from etl.format import names
from etl.sources.containers import (
    declared_classes,
    duplicate_in,
    joined,
    match_files,
    opened_file,
    record_source,
)
from etl.sources.entries import ListContext, SourceListing
from etl.sources.intake import RecordIntake
from etl.sources.kinds.listing import check_unique_columns
from etl.sources.labels import class_name_of
from etl.sources.safe_files import too_large

ROWS_PER_BATCH = 64
"""Rows a Parquet file is read in at a time (its row groups stream; memory stays flat)."""

TABLE_ERRORS = (pa.ArrowException, OSError, ValueError)


def list_parquet(config: ParquetSource, context: ListContext) -> SourceListing:
    """Every row of every table `config.files` matches (Parquet, Arrow IPC file or stream)."""
    declared: tuple[str, ...] | None = None
    matched = match_files(config.path, config.files, config.storage_options)
    with RecordIntake(context) as intake:
        for relative, split in matched:
            with opened_file(config.path, relative, intake, config.storage_options) as f:
                if f is not None:
                    declared = _take_table(f, relative, split, config, intake) or declared
    classes = None if config.classes else declared_classes(intake, declared)
    # NOTE: an id twice in one table is found on the sorted listing, not in a set of every id
    return intake.listing(duplicate_in((r for r, _ in matched), "id"), classes)


def _take_table(
    f: IO[bytes], relative: str, split: str | None, config: ParquetSource, intake: RecordIntake
) -> tuple[str, ...] | None:
    """Take the rows of one table (their split: `split_column`, else the file's `split`);
    returns its ClassLabel names, if it declares them."""
    where = joined(config.path, relative)
    try:
        schema, batches = _open_table(f)
    except TABLE_ERRORS as exc:
        intake.reject(
            names.path_to_source(relative),
            "unreadable",
            f"{relative}: not a readable Parquet or Arrow file ({exc})",
        )
        return None
    keys = [c.key for c in intake.columns]
    columns = _columns(schema, config, where, keys)
    class_names = _class_label_names(schema, config.label_column)
    classes = config.classes or class_names
    row = 0
    try:
        for batch in batches(columns):
            cells = _binary_cells(batch.column(config.image_column), config.image_column, where)
            labels = batch.column(config.label_column).to_pylist()
            ids = batch.column(config.id_column).to_pylist() if config.id_column else None
            splits = batch.column(config.split_column).to_pylist() if config.split_column else None
            values = {key: batch.column(key).to_pylist() for key in keys}
            for i, (image, path) in enumerate(cells):
                raw_id = row if ids is None else ids[i]
                key = _row_id(raw_id)
                row += 1
                if key is None:
                    intake.reject(
                        record_source(relative, f"row {row - 1}".encode()),
                        "bad_row",
                        f"{where}: row {row - 1}: id {raw_id!r} in {config.id_column!r} is not "
                        "a non-empty text, integer or bytes",
                    )
                    continue
                row_split = splits[i] if splits is not None else split
                record = {k: v[i] for k, v in values.items()}
                _take_row(
                    relative,
                    key,
                    (image, path, labels[i], row_split, record),
                    f"{where}: row {row - 1}: ",
                    classes,
                    config,
                    intake,
                )
    except TABLE_ERRORS as exc:
        intake.reject(
            names.path_to_source(relative),
            "unreadable",
            f"{relative}: cannot read past row {row}: {exc}",
        )
    return class_names


Row = tuple[memoryview | None, str | None, Any, Any, dict[str, Any]]
"""A table row as read: its image bytes, the image's path, label, split, declared columns."""


def _take_row(
    relative: str,
    key: bytes,
    row: Row,
    where: str,
    classes: tuple[str, ...] | None,
    config: ParquetSource,
    intake: RecordIntake,
) -> None:
    source = record_source(relative, key)
    image, path, label, split, record = row
    if image is None:
        stored = f"only a path to its image ({path!r})" if path else "no image"
        intake.reject(source, "no_image", f"the row holds {stored}, no bytes")
        return
    if len(image) > config.max_file_bytes:
        intake.reject(source, "file_too_large", too_large(len(image), config.max_file_bytes))
        return
    try:
        class_name = class_name_of(label, classes)
    except (ValueError, TypeError) as exc:
        intake.reject(source, "unknown_label", f"{config.label_column}: {exc}", image)
        return
    if class_name is None:
        intake.reject(source, "unknown_label", f"{config.label_column} is empty", image)
        return
    if split is not None and not isinstance(split, str):
        intake.reject(source, "bad_row", f"{config.split_column} {split!r} is not text", image)
        return
    intake.add(source, image, class_name, split or None, record=record, where=where)


Batches = Any
"""columns -> an iterator of pa.RecordBatch holding those columns."""


def _open_table(f: IO[bytes]) -> tuple[pa.Schema, Batches]:
    """(schema, batches) of a Parquet file, an Arrow IPC file or an Arrow IPC stream, told
    apart by their first bytes, not by the file's suffix."""
    magic = f.read(6)
    f.seek(0)
    if magic[:4] == b"PAR1":
        # NOTE: pre_buffer (the default) read far ahead of the batches: 600 MiB of resident
        # memory for a 375 MB file; without it, and with reads buffered, the peak is 275 MiB
        parquet = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)

        def parquet_batches(columns: list[str]) -> Iterator[pa.RecordBatch]:
            return parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns)

        return parquet.schema_arrow, parquet_batches
    if magic == b"ARROW1":
        reader = ipc.open_file(f)

        def file_batches(columns: list[str]) -> Iterator[pa.RecordBatch]:
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i).select(columns)

        return reader.schema, file_batches
    stream = ipc.open_stream(f)

    def stream_batches(columns: list[str]) -> Iterator[pa.RecordBatch]:
        for batch in stream:
            yield batch.select(columns)

    return stream.schema, stream_batches


def _columns(schema: pa.Schema, config: ParquetSource, where: str, keys: list[str]) -> list[str]:
    """The columns to read (with the declared columns' `keys`); a SourceError naming the file
    when one the config names is absent."""
    wanted = {
        "image_column": config.image_column,
        "label_column": config.label_column,
        "id_column": config.id_column,
        "split_column": config.split_column,
    }
    for key, column in wanted.items():
        if column is not None and column not in schema.names:
            raise SourceError(
                f"{where}: no column {column!r} (source.{key}); columns are {schema.names}"
            )
    for key in keys:
        if key not in schema.names:
            raise SourceError(f"{where}: no column {key!r} (columns:); columns are {schema.names}")
    read = list(dict.fromkeys([*(c for c in wanted.values() if c is not None), *keys]))
    check_unique_columns(schema, read, where)
    return read


def _class_label_names(schema: pa.Schema, column: str) -> tuple[str, ...] | None:
    """The class names a Hugging Face `ClassLabel` feature stores in the schema metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return None
    label_names = feature.get("names") if isinstance(feature, dict) else None
    if feature.get("_type") != "ClassLabel" or not isinstance(label_names, list):
        return None
    if not label_names or not all(isinstance(n, str) for n in label_names):
        return None
    return tuple(label_names)


def _row_id(value: Any) -> bytes | None:
    """A row id as raw key bytes: text, an integer or bytes; None when empty or another type."""
    if isinstance(value, str) and value:
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    return None


def _binary_cells(
    column: pa.Array, name: str, where: str
) -> list[tuple[memoryview | None, str | None]]:
    """(image bytes or None, path or None) of each row of an image column: binary, or a struct
    {bytes, path} (the Hub's Image feature). The bytes are views of Arrow's buffers: no copy."""
    paths: list[str | None] = [None] * len(column)
    if pa.types.is_struct(column.type):
        children = dict(zip([f.name for f in column.type], column.flatten(), strict=True))
        if "bytes" not in children:
            raise SourceError(f"{where}: column {name!r} is a struct without a 'bytes' field")
        if "path" in children:
            paths = children["path"].to_pylist()
        column = children["bytes"]
    if pa.types.is_binary_view(column.type) or pa.types.is_fixed_size_binary(column.type):
        column = column.cast(pa.large_binary())
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise SourceError(
            f"{where}: column {name!r} holds {column.type}, not image bytes (source.image_column)"
        )
    _, offsets_buffer, data_buffer = column.buffers()
    width = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, width)[column.offset : column.offset + len(column) + 1]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [
        (data[int(offsets[i]) : int(offsets[i + 1])] if valid[i] else None, paths[i])
        for i in range(len(column))
    ]
