"""A byte limit on the shards of a dataset in a store's cache, shared by every process of a node.

`PackedDataset.open("s3://...", cache_limit="20GiB")` reads through a `BoundedCache` instead of
fetching every shard at open: a shard is downloaded (and verified, `etl.storage.store`) when a
reader needs it, or earlier by the loader's fetch-ahead thread, and shards are removed to stay
within the limit.

NOTE [ bounded cache ]: the processes of a node (ranks, their workers) coordinate through
the cache folder only, with `flock` and renames; nothing in shared memory, nothing a killed
process leaves locked (the kernel drops its locks):

- **Holds.** A process holds a shard (LOCK_SH on `<shard>.use`) while it needs the file: a
  reader while it maps it (a reader of a bounded cache maps only the shards of its current
  batch), the fetch-ahead thread from the download until the loader has delivered the batch
  it was fetched for. A shard is removed only under LOCK_EX|LOCK_NB of its `.use`: never one
  that anybody holds, so no process ever maps a file that is being deleted.
- **Room.** Under `shards/.room.lock`, the bytes of the cached shards and of the downloads under
  way (a `.tmp-` file counts at its shard's full size; one whose process died is removed)
  plus the new shard must fit the limit;
  shards nobody holds are removed, least recently used first (a hit touches the file), until
  they do. A download that cannot get room waits (others finish their batches) for at most
  the store timeout, then fails naming the limit: the shards one batch of every process needs
  at once must fit in it.
- **Fetch ahead.** The loader hands the epoch's remaining order, batch by batch, to a thread in
  the training process that downloads each batch's shards in that order, while there is room
  without removing a shard anybody holds: the shards the remaining order needs soonest are
  fetched first and are never removed before their batch is delivered; those it no longer
  needs are the ones removed, least recently used first.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from etl.errors import ShardError
from etl.format.shards import SHARDS_DIR
from etl.storage.cache_files import (
    Reservation,
    abandoned,
    is_cached,
    lock_file,
    locked,
    temp_name_of,
)
from etl.storage.fetch_ahead import WAIT, FetchAhead
from etl.storage.store import StoreDataset

ROOM_LOCK = ".room.lock"
USE_SUFFIX = ".use"


class BoundedCache:
    """The shards `names` (file sizes `sizes`) of the dataset at `url`, in its mirror under
    `cache_dir`, within `limit` bytes of shard files for every process using that mirror.

    Pickles to a worker as its settings; each process opens its own store connection and
    takes its own holds (see NOTE [ bounded cache ])."""

    def __init__(
        self,
        url: str,
        cache_dir: Path | str | None,
        storage_options: Mapping[str, Any] | None,
        timeout: float,
        limit: int,
        names: Sequence[str],
        sizes: Sequence[int],
        checksums: Sequence[str],
        algorithm: str,
        shared: bool | None = None,
    ) -> None:
        largest = max(sizes, default=0)
        if limit < largest:
            name = names[list(sizes).index(largest)]
            raise ShardError(
                f"{url}: cache_limit {limit:,} bytes is smaller than one shard ({name}, "
                f"{largest:,} bytes): raise it to at least that"
            )
        self.url = url
        self.cache_dir = cache_dir
        self.storage_options = dict(storage_options or {})
        self.timeout = timeout
        self.limit = limit
        self.names = tuple(names)
        self.sizes = tuple(int(s) for s in sizes)
        self.checksums = tuple(checksums)
        self.algorithm = algorithm
        self.shared = shared
        self.size_of = dict(zip(self.names, self.sizes, strict=True))
        self._store: StoreDataset | None = None
        self._store_pid = os.getpid()
        self._holds: dict[tuple[str, int], int] = {}
        self._holds_pid = os.getpid()
        self._lock = threading.Lock()
        self._ahead: FetchAhead | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_store=None, _holds={}, _ahead=None)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._holds_pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def store(self) -> StoreDataset:
        """This process's connection to the store (a forked worker makes its own: fsspec's
        async drivers are not fork-safe)."""
        if self._store is None or self._store_pid != os.getpid():
            self._store_pid = os.getpid()
            self._store = StoreDataset(
                self.url, self.cache_dir, self.storage_options, self.timeout, shared=self.shared
            )
        return self._store

    @property
    def folder(self) -> Path:
        """The mirror's shards folder."""
        return self.store.root / SHARDS_DIR

    def path(self, shard: int) -> Path:
        return self.store.shard_file(self.names[shard])

    # -- holds --------------------------------------------------------------------------

    def hold(self, shard: int, owner: str = "reader") -> None:
        """Hold `shard` (LOCK_SH on its `.use`) for `owner` (the reader, or the fetch-ahead
        thread: each its own lock, so one letting go never frees the other's): nobody
        removes it until every holder has let go."""
        with self._lock:
            holds = self._own_holds()
            if (owner, shard) in holds:
                return
            path = self._use_file(shard)
            fd = lock_file(path, self.store.shared)
            fcntl.flock(fd, fcntl.LOCK_SH)
            holds[owner, shard] = fd

    def release(self, shard: int, owner: str = "reader") -> None:
        with self._lock:
            fd = self._own_holds().pop((owner, shard), None)
        if fd is not None:
            os.close(fd)

    def held(self, owner: str = "reader") -> set[int]:
        with self._lock:
            return {shard for who, shard in self._own_holds() if who == owner}

    def _own_holds(self) -> dict[tuple[str, int], int]:
        """This process's holds: a forked child starts with none (the descriptors it
        inherited share its parent's locks, and stay the parent's to release)."""
        if self._holds_pid != os.getpid():
            self._holds, self._holds_pid, self._ahead = {}, os.getpid(), None
        return self._holds

    def _use_file(self, shard: int) -> Path:
        path = self.path(shard)
        return path.with_name(path.name + USE_SUFFIX)

    # -- fetching -----------------------------------------------------------------------

    def acquire(self, shards: Sequence[int], owner: str = "reader") -> None:
        """Hold every shard of `shards` (one batch's) and have each in the cache, verified:
        all or none, so that no process holds part of a batch while it waits for room for the
        rest (two such processes would wait for each other). ShardError naming the limit if
        there is no room within the store timeout."""
        wanted = list(dict.fromkeys(shards))
        deadline = time.monotonic() + self.timeout
        while not self.fetch(wanted, self.limit, owner):
            if time.monotonic() > deadline:
                need = sum(self.sizes[s] for s in wanted)
                names = ", ".join(self.names[s] for s in wanted[:3])
                raise ShardError(
                    f"{self.url}: no room in the cache ({self.folder}) for a batch's shards "
                    f"({names}{', ...' if len(wanted) > 3 else ''}: {need:,} bytes) within "
                    f"cache_limit {self.limit:,} bytes after {self.timeout:g} s: what every "
                    "process reading it holds at once does not leave room; raise cache_limit"
                )
            time.sleep(WAIT)

    def fetch(self, shards: list[int], limit: int, owner: str) -> bool:
        """Hold every shard of `shards` for `owner` and have each in the cache; False, holding
        and downloading nothing, if the missing ones do not all fit in `limit` now."""
        reserved = self.reserve(shards, limit, owner)
        if reserved is None:
            return False
        self.download(shards, reserved, owner)
        return True

    def reserve(self, shards: list[int], limit: int, owner: str) -> list[Reservation] | None:
        """Hold every shard of `shards` for `owner` and reserve room for the missing ones
        (each a reservation file, locked while it lives), for `download` to fill; None,
        holding nothing, if they do not all fit in `limit` now.

        Room is made, the downloads reserved and the holds taken under the room lock, which
        every removal takes too: nothing is removed between the look and the hold."""
        shared = self.store.shared
        with locked(self.store.folder(self.folder) / ROOM_LOCK, shared):
            missing = [s for s in shards if not is_cached(self.path(s))]
            need = sum(self.sizes[s] for s in missing)
            mine = {self.path(s) for s in shards}
            used, idle = self._usage()
            for victim in idle:
                if used + need <= limit:
                    break
                if victim not in mine:
                    used -= _remove_unheld(victim, shared)
            if used + need > limit:
                return None
            reserved = [Reservation.made(s, self.path(s), shared) for s in missing]
            for shard in shards:
                self.hold(shard, owner)
                if shard not in missing:
                    os.utime(self.path(shard))  # recently used: removed last
        return reserved

    def download(self, shards: list[int], reserved: list[Reservation], owner: str) -> None:
        """Download the shards `reserve` made room for (each once per node: under its
        `.lock`, another process may have fetched it meanwhile); on failure let go of every
        shard of `shards`. Either way the reservations are removed."""
        try:
            for one in reserved:
                shard, final = one.shard, self.path(one.shard)
                with locked(final.with_name(final.name + ".lock"), self.store.shared):
                    if is_cached(final):  # another process fetched it meanwhile
                        continue
                    self.store.download_shard(
                        self.names[shard], self.checksums[shard], self.sizes[shard],
                        self.algorithm, one.path,
                    )  # fmt: skip
        except BaseException:
            for shard in shards:
                self.release(shard, owner)
            raise
        finally:
            for one in reserved:
                one.drop()

    def _usage(self) -> tuple[int, list[Path]]:
        """Bytes of cached shards and downloads under way, and the cached shard files,
        least recently used first."""
        used, cached = 0, []
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return 0, []
        for entry in entries:
            name = entry.name
            try:
                size = entry.stat().st_size
                shard = temp_name_of(name)
                if shard is not None:  # a download under way, at its final size
                    if abandoned(Path(entry.path)):  # its process died: it never finishes
                        os.unlink(entry.path)
                        continue
                    used += self.size_of.get(f"{SHARDS_DIR}/{shard}", size)
                elif name.endswith(".npy"):
                    used += size
                    cached.append((entry.stat().st_mtime_ns, Path(entry.path)))
            except FileNotFoundError:
                continue
        return used, [path for _, path in sorted(cached)]

    # -- fetching ahead -----------------------------------------------------------------

    def fetch_ahead(self, batches: Iterator[Sequence[int]], delivered: Callable[[], int]) -> None:
        """Download the shards of `batches` (each a batch's shard numbers, in the order the
        loader will deliver them) ahead, on a thread, each held until `delivered()` (batches
        handed to the training loop) has passed its batch. Replaces any earlier thread."""
        self.stop_ahead()
        self._ahead = FetchAhead(self, batches, delivered)

    def stop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.stop()


def _remove_unheld(path: Path, shared: bool) -> int:
    """Remove the shard file at `path` if nobody holds it; its size if removed, else 0."""
    use = path.with_name(path.name + USE_SUFFIX)
    try:
        fd = lock_file(use, shared)
    except (OSError, ShardError):
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return 0
    try:
        size = path.stat().st_size
        path.unlink()
        return size
    except FileNotFoundError:
        return 0
    finally:
        os.close(fd)
