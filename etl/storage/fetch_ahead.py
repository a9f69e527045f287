"""The fetch-ahead thread of a bounded cache: one epoch's shards downloaded in the order the
loader will deliver its batches, each held until its batch is delivered, never more than
`BATCHES_AHEAD` batches ahead and always leaving a reader room (NOTE [ bounded cache ] in
`etl.storage.cache`, whose `BoundedCache` starts one per epoch and is its `cache`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Any

from etl.storage.cache_files import Reservation
from etl.storage.store import DOWNLOADS

AHEAD = "ahead"
"""The fetch-ahead thread's holds."""
BATCHES_AHEAD = 16
"""Batches the fetch-ahead thread may hold shards for beyond the last one delivered."""
WAIT = 0.05
"""Seconds between two looks for room, or for the loader to move on."""


class FetchAhead:
    """The fetch-ahead thread of one epoch (see NOTE [ bounded cache ])."""

    def __init__(
        self, cache: Any, batches: Iterator[Sequence[int]], delivered: Callable[[], int]
    ) -> None:
        self.cache, self.batches, self.delivered = cache, batches, delivered
        self.stopped = threading.Event()
        self.pinned: dict[int, int] = {}
        """shard -> the last batch it was held for."""
        self.headroom = 0
        """Bytes of the largest batch seen (at most half the limit): left free for readers."""
        self.downloads = ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="etl-fetch-ahead")
        """Downloads in flight at once: a store serves parallel GETs faster than one."""
        self.thread = threading.Thread(target=self._run, name="etl-fetch-ahead", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.cache.timeout)

    def _run(self) -> None:
        try:
            for number, shards in enumerate(self.batches):
                if not self._fetch(number, list(dict.fromkeys(shards))):
                    return
            while self.pinned and not self.stopped.wait(WAIT):
                self._unpin()
        except Exception:  # nothing lost: the reader's own fetch names it when it needs it
            pass
        finally:
            self.stopped.set()  # what is queued only lets go of its reservation
            self.downloads.shutdown(wait=True)
            for shard in list(self.pinned):
                self.cache.release(shard, AHEAD)
            self.pinned.clear()

    def _download(self, shards: list[int], reserved: list[Reservation]) -> None:
        if self.stopped.is_set():  # the epoch ended first: give the room back
            for one in reserved:
                one.drop()
            return
        with suppress(Exception):  # the reader's own fetch names it when it needs it
            self.cache.download(shards, reserved, AHEAD)

    def _fetch(self, batch: int, shards: list[int]) -> bool:
        """Hold and fetch the shards of `batch`, no more than `BATCHES_AHEAD` batches ahead of
        the loader, leaving room in the cache for a batch as large as the largest seen (what
        a reader, of this process or another, needs to go on; at most half the limit) but
        for the next batch; False once stopped."""
        need = sum(self.cache.sizes[s] for s in shards)
        self.headroom = min(max(self.headroom, need), self.cache.limit // 2)
        while not self.stopped.is_set():
            self._unpin()
            delivered = self.delivered()
            if batch < delivered:
                return True  # delivered already: the loader got past it
            # the next batch may use the whole limit: its reader would fetch it anyway
            room = self.cache.limit - (self.headroom if batch > delivered else 0)
            reserved = (
                self.cache.reserve(shards, room, AHEAD)
                if batch < delivered + BATCHES_AHEAD
                else None
            )
            if reserved is not None:
                for shard in shards:
                    self.pinned[shard] = batch
                self.downloads.submit(self._download, shards, reserved)
                return True
            self.stopped.wait(WAIT)
        return False

    def _unpin(self) -> None:
        delivered = self.delivered()
        for shard, batch in list(self.pinned.items()):
            if batch < delivered:
                del self.pinned[shard]
                self.cache.release(shard, AHEAD)
