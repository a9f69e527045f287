"""Listing an LMDB environment: one sample per key (a keys entry, or a cursor scan); no stat
proves a value unchanged, so every value is read (memory-mapped) and hashed here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from etl.config import LmdbSource
from etl.errors import SourceError, described
from etl.format import names
from etl.format.checksums import digest
from etl.sources.entries import FileStat, ListContext, SourceListing
from etl.sources.intake import ListingBuilder
from etl.sources.kinds.lmdb.environment import lmdb_record, open_lmdb
from etl.sources.kinds.lmdb.key_labels import KeyLabels
from etl.sources.kinds.lmdb.keys_entry import listed_keys
from etl.sources.labels import label_text
from etl.sources.listed_rejects import SourceReject
from etl.sources.payloads import PICKLE_ADVICE, UNPICKLE_ERRORS, field_of, is_pickle
from etl.sources.safe_files import too_large


def list_lmdb(config: LmdbSource, context: ListContext) -> SourceListing:
    """One sample per key (from `keys_entry`, else a cursor scan minus `meta_keys`); `source`
    is the key as `names.to_source` spells it. Every value is read and hashed here
    (memory-mapped, no copy), so a value whose bytes changed is packed again even when its
    length did not change. A pickled value is a `pickle` reject unless allow_pickle."""
    labels = KeyLabels(config.labels) if config.labels is not None else None
    env = open_lmdb(config.path)
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
        return SourceReject(source, "file_too_large", too_large(len(value), config.max_file_bytes))
    if is_pickle(value) and not config.allow_pickle:
        return reject(
            "pickle",
            f"the value is a Python pickle (protocol {value[1]}); {PICKLE_ADVICE}",
        )
    try:
        image, record = lmdb_record(value, config)
    except UNPICKLE_ERRORS as exc:
        return reject("unreadable", f"pickled record: {described(exc)}")
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
            label = label_text(field_of(record, config.label_field))
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
