"""LMDB environments, opened once per process, and one key read back (a worker's read)."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etl.errors import SourceError, described
from etl.format import names
from etl.sources.payloads import UNPICKLE_ERRORS, field_of, image_bytes, is_pickle

if TYPE_CHECKING:
    from etl.config import LmdbSource


def lmdb_record(value: bytes | memoryview, config: LmdbSource) -> tuple[bytes | memoryview, Any]:
    """(the bytes the decoder sees, the unpickled record or None) of one LMDB value: the value
    itself, or with allow_pickle the image field of a pickled record. Raises ValueError,
    KeyError or pickle's errors for a record without a usable image field."""
    if not (config.allow_pickle and is_pickle(value)):
        return value, None
    record = pickle.loads(value)  # allowed explicitly by the config (allow_pickle)
    image = image_bytes(field_of(record, config.image_field), f"field {config.image_field!r}")
    return image, record


_ENVS: dict[str, tuple[tuple[int, int, int, int], Any]] = {}
"""Environments this process opened, by path, with (pid, dev, inode, size) of the data file
when opened: a forked child, or a file that grew or was replaced, opens it again."""
_ENVS_LOCK = threading.Lock()


def _data_file(path: Path) -> Path:
    return path / "data.mdb" if path.is_dir() else path


def open_lmdb(path: Path) -> Any:
    """The environment at `path` (a folder holding data.mdb, or the data file), read-only and
    without the lock file, opened once per process until `close_lmdb`.

    NOTE: lock=False means we never write lock.mdb, so a read-only mount works and a reader
    never blocks a writer; the price is that a concurrent writer is not coordinated with. A
    value changed during the run fails the hash check in the worker and is rejected `changed`.
    """
    try:
        import lmdb
    except ImportError:
        raise SourceError(
            "source kind 'lmdb' needs the lmdb package: pip install 'etl-memmap[lmdb]'"
        ) from None
    try:
        st = os.stat(_data_file(path))
    except OSError as exc:
        raise SourceError(f"source.path: {path} is not an LMDB environment ({exc})") from None
    identity = (os.getpid(), st.st_dev, st.st_ino, st.st_size)
    cached = _ENVS.get(str(path))
    if cached is not None and cached[0] == identity:
        return cached[1]
    with _ENVS_LOCK:  # threads of the 'threading' backend share this cache
        cached = _ENVS.get(str(path))
        if cached is not None:
            if cached[0] == identity:
                return cached[1]
            if cached[0][0] == identity[0]:
                cached[1].close()  # py-lmdb refuses a second open of one path in a process
        try:
            env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False)
        except lmdb.Error as exc:
            raise SourceError(
                f"source.path: {path}: cannot open as LMDB ({exc}); if this process has it "
                "open already, close it first"
            ) from None
        _ENVS[str(path)] = (identity, env)
        return env


def close_lmdb() -> None:
    """Close every environment this process opened (the pipeline calls it at the end of a run,
    so the caller may open the environment for writing afterwards)."""
    pid = os.getpid()
    with _ENVS_LOCK:
        while _ENVS:
            _, ((owner, *_), env) = _ENVS.popitem()
            if owner == pid:
                env.close()


def read_lmdb(config: LmdbSource, locator: str) -> bytes:
    try:
        env = open_lmdb(config.path)
    except SourceError as exc:
        raise OSError(str(exc)) from None
    import lmdb  # open_lmdb succeeded: it is installed

    try:
        with env.begin(buffers=True) as txn:
            value = txn.get(names.to_raw(locator))
            if value is None:
                raise FileNotFoundError(f"key {locator!r} is no longer in {config.path}")
            return bytes(lmdb_record(value, config)[0])
    except (lmdb.Error, *UNPICKLE_ERRORS) as exc:
        raise OSError(f"key {locator!r}: {described(exc)}") from None
