"""The `python` kind: a function (`source.function`) returns the records; they exist only while
it runs, so each is hashed here and spooled for the workers (NOTE [spool] in
etl/sources/spool.py). A bad record becomes a reject naming its index."""

from __future__ import annotations

import importlib
import numbers
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from etl.config import PythonSource
from etl.errors import SourceError, described
from etl.sources.entries import ListContext, SourceListing
from etl.sources.intake import Occurrences, RecordIntake
from etl.sources.kind import SourceKind
from etl.sources.labels import label_text
from etl.sources.payloads import image_bytes
from etl.sources.spool import read_slice

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
        raise SourceError(f"source.function {spec!r} raised {described(exc)}") from exc
    met = Occurrences()
    index = 0
    keys = frozenset(column.key for column in context.columns)
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
                source, payload, label, split = _parse_record(record, index, spec, keys)
                met.meet(source)
                index += 1
                if label is None:
                    intake.reject(source, "unknown_label", "the record has no label", payload)
                else:
                    values = record if isinstance(record, Mapping) else {}
                    where = f"record {index - 1}: "
                    intake.add(source, payload, label, split, record=values, where=where)
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
            f"source.function {spec!r}: importing {module_name!r} raised {described(exc)}"
        ) from exc
    finally:
        if added:
            sys.path.remove(folder)
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        what = "no" if function is None else f"a {type(function).__name__}, not a callable,"
        raise SourceError(f"source.function {spec!r}: module {module_name!r} has {what} {attr!r}")
    return function


def _parse_record(
    record: Any, index: int, spec: str, columns: frozenset[str] = frozenset()
) -> tuple[str, bytes, str | None, str | None]:
    """(source, encoded bytes, class name or None, split or None) of one record, or a
    SourceError naming the record index: a malformed record is a bug in the function. A dict
    record may also hold the keys of the declared `columns`."""
    where = f"source.function {spec!r}: record {index}"
    if isinstance(record, Mapping):
        unknown = sorted(set(map(str, record)) - set(RECORD_KEYS) - columns)
        if unknown:
            expected = [*RECORD_KEYS, *sorted(columns)]
            raise SourceError(f"{where} has unknown keys {unknown}; expected {expected}")
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
        payload = image_bytes(data, "data")
    except ValueError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    try:
        class_name = label_text(label)
    except TypeError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    if split is not None and not isinstance(split, str):
        raise SourceError(f"{where} ({source!r}): split {split!r} is not a string")
    return source, payload, class_name, split or None


KIND = SourceKind(
    name="python",
    list=list_python,
    read=read_slice,
    check=lambda config: None,  # its function is imported, and checked, when it is listed
    by_path=False,
    spooled=True,
    in_place=False,
    columns=True,
)
