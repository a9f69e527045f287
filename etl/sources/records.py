"""LMDB and Python sources: no stat proves a value unchanged, so their listers read and hash
every value (LMDB values are memory-mapped; a Python source's records exist only while its
function runs) and set `content_hash`. A refused pickle or a bad record becomes a reject."""

from __future__ import annotations

import importlib
import numbers
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from etl.config import LmdbSource, PythonSource
from etl.errors import SourceError
from etl.format import names
from etl.format.checksums import digest
from etl.sources import readers, record_values
from etl.sources.base import (
    FileStat,
    ListContext,
    ListingBuilder,
    Occurrences,
    RecordIntake,
    SourceListing,
    SourceReject,
    label_text,
)
from etl.sources.key_labels import KeyLabels
from etl.sources.keys_entry import listed_keys


def list_lmdb(config: LmdbSource, context: ListContext) -> SourceListing:
    """One sample per key (from `keys_entry`, else a cursor scan minus `meta_keys`); `source`
    is the key as `names.to_source` spells it. Every value is read and hashed here
    (memory-mapped, no copy), so a value whose bytes changed is packed again even when its
    length did not change. A pickled value is a `pickle` reject unless allow_pickle."""
    labels = KeyLabels(config.labels) if config.labels is not None else None
    env = record_values.open_lmdb(config.path)
    taken = ListingBuilder(context.scratch)
    with env.begin(buffers=True) as txn:
        for key in _lmdb_keys(txn, config):
            source = names.to_source(key)
            value = txn.get(key)
            if value is None:
                why = f"keys entry {config.keys_entry!r} lists it; no such key"
                taken.reject(SourceReject(source, "missing", why))
                continue
            outcome = _lmdb_sample(source, value, config, labels, context.checksum)
            if isinstance(outcome, SourceReject):
                taken.reject(outcome)
            else:
                taken.files.add(source, source, *outcome)
    # keys are unique (a scan, or a keys entry checked for repeats): nothing is taken twice
    return taken.build(lambda source: ("duplicate_key", "the key is listed twice"))


def _lmdb_sample(
    source: str,
    value: memoryview,
    config: LmdbSource,
    labels: KeyLabels | None,
    checksum: str,
) -> tuple[str, FileStat, str | None, str] | SourceReject:
    """One key's (class name, stat, split, content hash), or its reject. The stat's size and
    the hash describe the bytes the decoder will see: the value, or a pickled record's image
    field."""

    def reject(reason: str, message: str) -> SourceReject:
        return SourceReject(source, reason, message, len(value), 0, digest(value, checksum))

    if len(value) > config.max_file_bytes:
        return SourceReject(
            source, "file_too_large", readers.too_large(len(value), config.max_file_bytes)
        )
    if record_values.is_pickle(value) and not config.allow_pickle:
        return reject(
            "pickle",
            f"the value is a Python pickle (protocol {value[1]}); {record_values.PICKLE_ADVICE}",
        )
    try:
        image, record = record_values.lmdb_record(value, config)
    except record_values.UNPICKLE_ERRORS as exc:
        return reject("unreadable", f"pickled record: {type(exc).__name__}: {exc}")
    split: str | None = None
    if labels is not None:
        label, split = labels.get(source)
        if label is None:
            return reject("unknown_label", f"key not in {config.labels} (or its label is empty)")
    else:
        assert config.label_field is not None  # the config requires labels or label_field
        if record is None:
            return reject(
                "unknown_label",
                f"not a pickled record, so it has no label field {config.label_field!r}",
            )
        try:
            label = label_text(record_values.field_of(record, config.label_field))
        except (KeyError, TypeError) as exc:
            return reject("unknown_label", f"pickled record: {exc}")
        if label is None:
            return reject("unknown_label", f"label field {config.label_field!r} is empty")
    return label, FileStat(len(image), 0, 0, 0), split, digest(image, checksum)


def _lmdb_keys(txn: Any, config: LmdbSource) -> Iterable[bytes]:
    """The keys to list: the keys entry's, or every key of a scan as the cursor reaches it
    (a list of 10M keys would be 10M objects)."""
    if config.keys_entry is None:
        return _scanned_keys(txn, {names.to_raw(k) for k in config.meta_keys})
    where = f"{config.path}: keys_entry {config.keys_entry!r}"
    raw = txn.get(names.to_raw(config.keys_entry))
    if raw is None:
        raise SourceError(f"{where} is not a key of the environment; omit it to scan all keys")
    return listed_keys(bytes(raw), config, where)


def _scanned_keys(txn: Any, skip: set[bytes]) -> Iterator[bytes]:
    for found in txn.cursor().iternext(keys=True, values=False):
        key = bytes(found)  # a copy: the buffer is the cursor's
        if key not in skip:
            yield key


RECORD_KEYS = ("id", "data", "array", "label", "split")


def list_python(config: PythonSource, context: ListContext) -> SourceListing:
    """Call `config.function(**config.options)` once and take every record it yields into a
    `RecordIntake`. Ids must be unique: a duplicate is an error naming them, after the whole
    iteration, so all are named at once.
    """
    spec = config.function
    function = _records_function(config)
    try:
        iterator = iter(function(**config.options))
    except Exception as exc:
        raise SourceError(f"source.function {spec!r} raised {type(exc).__name__}: {exc}") from exc
    met = Occurrences()
    index = 0
    try:
        with RecordIntake(context) as intake:
            while True:
                try:
                    record = next(iterator)
                except StopIteration:
                    break
                except Exception as exc:
                    raise SourceError(
                        f"source.function {spec!r} raised {type(exc).__name__} after {index} "
                        f"record(s): {exc}"
                    ) from exc
                source, payload, label, split = _parse_record(record, index, spec)
                met.meet(source)
                index += 1
                if label is None:
                    intake.reject(source, "unknown_label", "the record has no label", payload)
                else:
                    intake.add(source, payload, label, split)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # a generator stopped early releases its connection or files now
    listing = intake.listing(lambda source: ("duplicate_id", "the id is not unique"))
    dupes = intake.duplicated
    if dupes:
        named = ", ".join(
            f"{s!r} (records {', '.join(map(str, met.positions(s)))})" for s in dupes[:5]
        )
        more = f" and {len(dupes) - 5} more" if len(dupes) > 5 else ""
        raise SourceError(
            f"source.function {spec!r}: ids are not unique: {named}{more}; every record needs "
            "its own id, stable across runs"
        )
    return listing


def _records_function(config: PythonSource) -> Callable[..., Any]:
    """Import `module:function` with `config.path` first on sys.path (only while importing)."""
    spec = config.function
    module_name, _, attr = spec.partition(":")
    folder = str(config.path)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceError(
            f"source.function {spec!r}: cannot import {module_name!r} ({exc}); is it installed, "
            f"on PYTHONPATH or in {folder}?"
        ) from None
    except Exception as exc:
        raise SourceError(
            f"source.function {spec!r}: importing {module_name!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if added:
            sys.path.remove(folder)
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        what = "no" if function is None else f"a {type(function).__name__}, not a callable,"
        raise SourceError(f"source.function {spec!r}: module {module_name!r} has {what} {attr!r}")
    return function


def _parse_record(record: Any, index: int, spec: str) -> tuple[str, bytes, str | None, str | None]:
    """(source, encoded bytes, class name or None, split or None) of one record, or a
    SourceError naming the record index: a malformed record is a bug in the function."""
    where = f"source.function {spec!r}: record {index}"
    if isinstance(record, Mapping):
        unknown = sorted(set(map(str, record)) - set(RECORD_KEYS))
        if unknown:
            raise SourceError(f"{where} has unknown keys {unknown}; expected {list(RECORD_KEYS)}")
        if "id" not in record or "label" not in record:
            raise SourceError(f"{where} needs keys 'id' and 'label' (has {sorted(record)})")
        if ("data" in record) == ("array" in record):
            raise SourceError(f"{where} needs exactly one of 'data' (bytes) or 'array'")
        rid, label, split = record["id"], record["label"], record.get("split")
        data = record["data"] if "data" in record else record["array"]
    elif isinstance(record, tuple | list) and len(record) in (3, 4):
        rid, data, label = record[0], record[1], record[2]
        split = record[3] if len(record) == 4 else None
    else:
        raise SourceError(
            f"{where} is a {type(record).__name__}; expected a dict {{id, data|array, label, "
            "split?}} or a tuple (id, data_or_array, label[, split])"
        )
    if isinstance(rid, bool) or not isinstance(rid, str | numbers.Integral):
        raise SourceError(f"{where}: id {rid!r} is a {type(rid).__name__}; use a str or an int")
    source = rid if isinstance(rid, str) else str(int(rid))
    if not source:
        raise SourceError(f"{where}: the id is empty")
    if isinstance(data, np.ndarray) and data.dtype == object:
        raise SourceError(f"{where} ({source!r}): an object array; use a uint8 array")
    try:
        payload = record_values.image_bytes(data, "data")
    except ValueError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    try:
        class_name = label_text(label)
    except TypeError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    if split is not None and not isinstance(split, str):
        raise SourceError(f"{where} ({source!r}): split {split!r} is not a string")
    return source, payload, class_name, split or None
