"""Inputs in object storage (`s3://bucket/prefix`, any fsspec protocol): listing a prefix and
reading one object, the only code that talks to a store on the packing side.

The store is reached through fsspec (`pip install 'etl-memmap[s3]'`); endpoint and credentials
come from the environment or the driver's own configuration (for S3: AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, a profile), or from `source.storage_options` (`options` here), which travel
to the workers with the config and are never written or printed.

An object's "stat" is its size, its modification time and a 63-bit hash of its ETag (kept
where a file keeps its inode), so a rerun hashes only the objects whose metadata changed, as
it does with `stat` for files. Reads are made by the workers, each within `source.io_timeout`
(`etl.sources.timed`), never more than `source.max_file_bytes`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import xxhash

from etl.errors import SourceError, described
from etl.format.checksums import new_hasher
from etl.sources.entries import FileStat
from etl.sources.kept import keeping, kept_path, room_for, take
from etl.sources.safe_files import (
    HASH_CHUNK_BYTES,
    Refused,
    file_digest,
    read_regular_file,
    too_large,
)
from etl.storage.location import StoreUrl, as_location
from etl.storage.transport import STORE_TIMEOUT, Options, filesystem

_MTIME = re.compile(r"mtime|LastModified|last_modified|updated", re.I)


def store(url: str, options: Options | None = None) -> tuple[Any, str]:
    """(the fsspec filesystem, the path within it) of `url`; SourceError when its driver is
    missing."""
    return filesystem(url, options, SourceError)


def list_objects(
    url: str, options: Options | None = None, page_timeout: float | None = STORE_TIMEOUT
) -> Iterator[tuple[str, int, int, int]]:
    """(key relative to `url`, size, mtime in ns, ETag hash) of every object under the prefix,
    in the store's order, streamed a page at a time, each page within `page_timeout` seconds
    (NOTE [ a listing in pages ] in `etl.storage.calls`). SourceError naming `url` when it
    cannot be listed."""
    from etl.storage.calls import listing  # NOTE: here: asyncio, which a worker never needs

    fs, root = store(url, options)
    root = root.rstrip("/")
    # NOTE: fsspec keeps one filesystem per process and caches listings in it; a run that
    # trusted the last run's listing would miss what was added, or read a changed object at
    # its old size. Each run lists afresh; its reads then see the sizes it listed.
    fs.invalidate_cache()  # all of it: a path clears neither the folders below it
    found = listing(fs, root, page_timeout)
    while True:
        try:
            name, info = next(found)
        except StopIteration:
            return
        except Exception as exc:  # a driver's own errors (botocore, aiohttp) are no OSError
            raise SourceError(f"source.path: cannot list {url} ({described(exc)})") from None
        relative = name[len(root) + 1 :] if name.startswith(root + "/") else None
        if relative:
            yield relative, int(info.get("size") or 0), _mtime_ns(info), _etag_key(info)


def stats_under(
    url: str, options: Options | None = None, page_timeout: float | None = STORE_TIMEOUT
) -> dict[str, FileStat]:
    """What `list_objects` says of every object under the prefix, by key relative to it: the
    "stat" of each, to look listed keys up in (one listing, not a request per key)."""
    return {
        key: FileStat(size, mtime_ns, 0, etag)
        for key, size, mtime_ns, etag in list_objects(url, options, page_timeout)
    }


def is_object(url: str, options: Options | None = None) -> bool:
    """Whether `url` names an object (not a prefix, not nothing)."""
    return _asks(url, options, "isfile")


def is_folder(url: str, options: Options | None = None) -> bool:
    """Whether the prefix holds any object (object stores have no empty folders)."""
    return _asks(url, options, "isdir")


def _asks(url: str, options: Options | None, question: str) -> bool:
    """fs.isfile or fs.isdir (`question`) of `url`, never from a cached listing; SourceError
    naming `url` when the store cannot be reached."""
    fs, path = store(url, options)
    try:
        fs.invalidate_cache()  # all of it: a path clears neither the folders below it
        return bool(getattr(fs, question)(path))
    except Exception as exc:
        raise SourceError(f"source.path: cannot reach {url} ({described(exc)})") from None


def glob_objects(url: str, pattern: str, options: Options | None = None) -> list[str]:
    """The keys under the prefix `url` that the glob `pattern` matches, relative to it ('**'
    crosses folders); objects, never folders, and no key with a dot-named part (as a local
    glob skips dot-files). SourceError naming `url` when it cannot be listed."""
    fs, root = store(url, options)
    root = root.rstrip("/")
    try:
        fs.invalidate_cache()  # see list_objects
        found = fs.glob(f"{root}/{pattern}", detail=True)
    except Exception as exc:  # a driver's own errors (botocore, aiohttp) are no OSError
        raise SourceError(f"source.path: cannot list {url} ({described(exc)})") from None
    keys = []
    for name, info in found.items():
        relative = name[len(root) + 1 :] if name.startswith(root + "/") else ""
        hidden = any(part.startswith(".") for part in relative.split("/"))
        if relative and not hidden and info.get("type") != "directory":
            keys.append(relative)
    return keys


def open_object(url: str, options: Options | None = None) -> IO[bytes]:
    """One object, open for reading (seekable: a seek past what was read is a ranged GET).
    Every failure, on opening or on a later read, is an OSError naming the object."""
    fs, path = store(url, options)
    try:
        fs.invalidate_cache(path)  # see _chunks
        opened = fs.open(path, "rb", block_size=HASH_CHUNK_BYTES)
    except OSError:
        raise
    except Exception as exc:
        raise OSError(f"{url}: {described(exc)}") from None
    return io.BufferedReader(_Guarded(opened, url), HASH_CHUNK_BYTES)


class _Guarded(io.RawIOBase):
    """A store's file whose every failure is an OSError naming the object: the callers (tar,
    Parquet and Arrow readers) turn an OSError into a reject naming the file, and a driver's
    own error types would otherwise escape them."""

    def __init__(self, raw: Any, url: str) -> None:
        self._raw, self._url = raw, url

    def _guard(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except OSError:
            raise
        except Exception as exc:
            raise OSError(f"{self._url}: {described(exc)}") from None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._guard(self._raw.read, len(buffer))
        if not data and len(buffer):  # the end: where the listed size says it is?
            at, size = self._guard(self._raw.tell), getattr(self._raw, "size", None)
            if isinstance(size, int) and at < size:
                raise OSError(f"{self._url}: the store sent {at} of its {size} bytes")
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._guard(self._raw.seek, offset, whence))

    def tell(self) -> int:
        return int(self._guard(self._raw.tell))

    def close(self) -> None:
        if not self.closed:
            self._guard(self._raw.close)
        super().close()


def read_object(url: str, max_bytes: int, options: Options | None = None) -> bytes:
    """The bytes of one object, no more than `max_bytes` (`Refused('file_too_large')`); an
    object gone since it was listed is FileNotFoundError; any other failure an OSError.

    NOTE: one ranged GET (no HEAD first, no second request): packing reads each object once
    more after hashing it, and its bytes are checked against the content hash the hash phase
    recorded (`_chunks`, which checks the length too), so a short body is a `changed` reject
    there, never a sample. A request saved is a third of what packing from a store waits on."""
    fs, path = store(url, options)
    try:
        data = fs.cat_file(path, start=0, end=max_bytes + 1)
    except FileNotFoundError as exc:
        raise _named(exc, url) from None
    except Exception as exc:
        if _is_empty(fs, path):  # a range of an empty object is refused (HTTP 416)
            return b""
        if isinstance(exc, OSError):
            raise _named(exc, url) from None
        raise OSError(f"{url}: {described(exc)}") from None
    if len(data) > max_bytes:
        raise Refused("file_too_large", too_large(len(data), max_bytes))
    return bytes(data)


def _is_empty(fs: Any, path: str) -> bool:
    """Whether the object at `path` is there and empty (False when that cannot be known)."""
    try:
        return int(fs.info(path).get("size", -1)) == 0
    except Exception:
        return False


def object_digest(
    url: str,
    algorithm: str,
    max_bytes: int,
    options: Options | None = None,
    size: int | None = None,
    keep: Path | None = None,
) -> str:
    """The content hash of one object, streamed in HASH_CHUNK_BYTES pieces. `size`: the size
    it was listed with (else the store is asked first, a request more); fewer bytes than that
    is an OSError. `keep`: a folder where the bytes are also kept for the pack phase, where
    there is room (`etl.sources.kept`)."""
    hasher = new_hasher(algorithm)
    chunks = _chunks(url, max_bytes, options, size)
    if keep is not None and room_for(keep, size):
        chunks = keeping(chunks, kept_path(keep, url))
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()


def read_located(
    locator: str, max_bytes: int, options: Options | None = None, keep: Path | None = None
) -> bytes:
    """The bytes of a listed file, whether its locator is a local path or an object's URL (the
    copy the hash phase kept in `keep`, where it did: `etl.sources.kept`)."""
    if not isinstance(as_location(locator), StoreUrl):
        return read_regular_file(locator, max_bytes)
    kept = take(keep, locator) if keep is not None else None
    if kept is not None and len(kept) <= max_bytes:
        return kept
    return read_object(locator, max_bytes, options)


def located_digest(
    locator: str,
    algorithm: str,
    max_bytes: int,
    options: Options | None = None,
    size: int | None = None,
    keep: Path | None = None,
) -> str:
    """The content hash of a listed file, a local path or an object's URL (`size`, `keep`:
    see `object_digest`), streamed."""
    if isinstance(as_location(locator), StoreUrl):
        return object_digest(locator, algorithm, max_bytes, options, size, keep)
    return file_digest(locator, algorithm, max_bytes)


def _chunks(
    url: str, max_bytes: int, options: Options | None, size: int | None = None
) -> Iterator[bytes]:
    fs, path = store(url, options)
    total = 0
    try:
        # NOTE: not the listing's cached size and ETag: a process that listed before (a run,
        # then an audit in the same process) would read a changed object as gone
        fs.invalidate_cache(path)
        with fs.open(path, "rb", block_size=HASH_CHUNK_BYTES, size=size) as f:
            while chunk := f.read(HASH_CHUNK_BYTES):
                total += len(chunk)
                if total > max_bytes:
                    raise Refused("file_too_large", too_large(total, max_bytes))
                yield chunk
            size = getattr(f, "size", None)
            if isinstance(size, int) and total != size:  # never take a cut body as whole
                raise OSError(f"the store sent {total} of its {size} bytes")
    except Refused:
        raise  # the reader's reject reason, as it is
    except OSError as exc:  # FileNotFoundError, PermissionError, ...: the same, naming `url`
        raise _named(exc, url) from None
    except Exception as exc:  # a driver's own errors become an OSError naming the object
        raise OSError(f"{url}: {described(exc)}") from None


def _named(exc: OSError, url: str) -> OSError:
    """`exc` with `url` in its message, of its own type where it can be made so."""
    message = f"{url}: {exc.strerror or exc}"
    try:
        return type(exc)(exc.errno, message)
    except Exception:  # a driver's subclass that takes other arguments
        return OSError(exc.errno, message)


def _mtime_ns(info: dict[str, Any]) -> int:
    for key, value in info.items():
        if _MTIME.search(key):
            stamp = getattr(value, "timestamp", None)
            if callable(stamp):
                return int(stamp() * 1e9)
            if isinstance(value, int | float):
                return int(value * 1e9)
    return 0


def _etag_key(info: dict[str, Any]) -> int:
    """A 63-bit hash of the object's ETag (or generation, or version id): the part of its
    "stat" that changes whenever its bytes do, even at the same size and second."""
    tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("VersionId")
    return xxhash.xxh3_64_intdigest(str(tag or "").encode()) >> 1
