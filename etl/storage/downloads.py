"""Downloads from a store that cannot run away: at most the bytes recorded for an object
(NOTE [ capped downloads ]), each call bounded in time, a download the store broke off tried
again from the start, a full cache disk named as such, and a digest computed as the bytes go by.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from etl.errors import EtlError
from etl.format.checksums import new_hasher
from etl.storage import calls
from etl.storage.cache_files import open_no_follow
from etl.storage.transport import why

T = TypeVar("T")

DOWNLOAD_CHUNK = 8 << 20
"""Bytes read from the store at a time while a file is downloaded and hashed."""

DOWNLOAD_TRIES = 3
"""Tries of a download the store broke off (a reset, a body cut short, a 5xx)."""

RETRY_BACKOFF = 0.5
"""Seconds before the second try of a download; twice that before the third."""

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""A local write failed for want of room: no space, a quota, a file-size limit."""


@dataclass(frozen=True)
class Reach:
    """What a download needs of its store: the fsspec filesystem, the seconds one call may
    take, and whether the cache folder is shared (its files' modes)."""

    fs: Any
    timeout: float
    shared: bool

    def bounded(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return calls.bounded(self.timeout, call, *args, **kwargs)


def get_capped(
    reach: Reach,
    remote: str,
    local: Path,
    error: type[EtlError],
    algorithm: str | None = None,
    *,
    cap: int,
    cut: bool = False,
) -> str | None:
    """Download `remote` to `local` (flushed to disk), never more than `cap` bytes (see
    `_read`); with `algorithm`, its digest, computed as it is written. A download the
    store broke off (a reset, a body cut short, a 5xx) is tried again from the start, up
    to DOWNLOAD_TRIES times; a file that cannot be downloaded is an `error` naming it."""
    for tries in range(DOWNLOAD_TRIES):
        try:
            return _get_once(reach, remote, local, error, algorithm, cap, cut)
        except _BrokenOff as exc:
            if tries == DOWNLOAD_TRIES - 1:
                raise error(str(exc)) from None
            time.sleep(RETRY_BACKOFF * (tries + 1))
    raise AssertionError("unreachable")


def _get_once(
    reach: Reach,
    remote: str,
    local: Path,
    error: type[EtlError],
    algorithm: str | None,
    cap: int,
    cut: bool,
) -> str | None:
    try:
        fd = open_no_follow(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, reach.shared)
        with os.fdopen(fd, "wb") as dst:
            digest = read_capped(reach, remote, error, algorithm, dst.write, cap, cut)
            dst.flush()
            os.fsync(dst.fileno())  # on disk before its rename makes it trusted
    except OSError as exc:
        local.unlink(missing_ok=True)
        if exc.errno in DISK_FULL:
            raise error(
                f"{remote}: the cache disk is full ({local.parent}: {why(exc)}): free "
                "space there, point ETL_CACHE (cache_dir=) at a larger disk, or set a "
                "smaller cache_limit"
            ) from None
        raise
    except BaseException:
        local.unlink(missing_ok=True)
        raise
    return digest


def capped_digest(
    reach: Reach, remote: str, algorithm: str, error: type[EtlError], size: int
) -> str:
    """The `algorithm` digest of `remote` as the store serves it (nothing written here),
    read up to one byte past `size`, the bytes uploaded: how an upload is verified (a
    longer object's digest differs). An `error` naming it if it cannot be read."""
    try:
        return cast(
            str, read_capped(reach, remote, error, algorithm, lambda _: None, size + 1, True)
        )
    except _BrokenOff as exc:
        raise error(str(exc)) from None


def read_capped(
    reach: Reach,
    remote: str,
    error: type[EtlError],
    algorithm: str | None,
    sink: Callable[[bytes], object],
    cap: int,
    cut: bool = False,
) -> str | None:
    """Every byte of `remote`, a chunk at a time, to `sink`; with `algorithm`, their
    digest. A file that cannot be read is an `error` naming it.

    NOTE [ capped downloads ]: a store may send more than it holds for the name (a lying
    or broken server, a replaced object): never more than `cap` bytes reach `sink`. Each
    read asks for at most one byte past the cap, so the first byte over ends the download
    (an `error` naming the cap) before it is written; with `cut`, the bytes up to the cap
    are kept and the rest left unread (an audit's copy: the size tells what is wrong)."""
    hasher = new_hasher(algorithm) if algorithm else None
    # NOTE: what the store serves now, never a size and ETag that fsspec's listings cache
    # kept from before (it would refuse a changed object as FileExpired)
    reach.fs.invalidate_cache(remote)
    try:
        # no read-ahead: a ranged GET a read, a driver's error as itself (gcsfs's prefetcher
        # wraps a missing object in an AssertionError)
        src = reach.bounded(reach.fs.open, remote, "rb", DOWNLOAD_CHUNK, cache_type="none")
        try:
            done = 0
            while chunk := reach.bounded(src.read, min(DOWNLOAD_CHUNK, cap + 1 - done)):
                if done + len(chunk) > cap:
                    if not cut:
                        raise _Overlong(remote, cap)
                    chunk = chunk[: cap - done]
                sink(chunk)
                if hasher is not None:
                    hasher.update(chunk)
                done += len(chunk)
                if done >= cap and cut:
                    break
        finally:
            with suppress(Exception):
                reach.bounded(src.close)
    except _Overlong as exc:
        raise error(str(exc)) from None
    except FileNotFoundError:
        raise error(f"{remote}: not in the store") from None
    except (PermissionError, TimeoutError) as exc:  # denied, or hung: trying again won't do
        raise error(f"{remote}: cannot download ({why(exc)})") from None
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise  # writing the copy failed, not reading the store (see `_get`)
        raise _BrokenOff(f"{remote}: cannot download ({why(exc)})") from None
    except Exception as exc:  # a driver's own (botocore, aiohttp) errors
        raise _BrokenOff(f"{remote}: cannot download ({why(exc)})") from None
    return hasher.hexdigest() if hasher is not None else None


class _BrokenOff(Exception):
    """A read the store broke off or refused for now: worth trying again."""


class _Overlong(Exception):
    """A download the store kept sending past its cap (NOTE [ capped downloads ])."""

    def __init__(self, remote: str, cap: int) -> None:
        super().__init__(
            f"{remote}: the store sends more than the {cap} bytes recorded for it: refused "
            "at the first byte over, nothing of it kept"
        )
