"""Calls to a store that may never return: bounded in time, and in the threads they leave.

NOTE [ calls left behind ]: a call to a store that accepts the connection and never answers
blocks for as long as its driver lets it (over 200 s with s3fs's defaults, measured), and a
blocked call cannot be interrupted, only left behind. So each call runs on a daemon thread of
its own; the caller waits at most its timeout, then gets a TimeoutError naming it and goes on.
Two rules keep what is left behind harmless:

- at most `MAX_LEFT_BEHIND` calls of a process may be stuck at once: past that, a call is
  refused at once (the store is not answering; more threads would not help), so a hung store
  costs a bounded number of threads, never one per retry;
- work on one object (an upload's writes and its close, or its abort) runs on one thread from
  start to end (`watched`): a caller that gives up never touches that object, the thread does
  when it comes back, so no file object is ever used from two threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, TypeVar, cast

T = TypeVar("T")

MAX_LEFT_BEHIND = 16
"""Calls to stores a process may have left running, stuck, before it refuses new ones."""

_left_behind = 0
_counted = threading.Lock()


Objects = AsyncGenerator[dict[str, Any], None]
"""A store's objects under a prefix, as fsspec info dicts, fetched a page at a time."""


class Abandoned(Exception):
    """Raised in a watched call's own thread at its next step once its caller has given up."""


def left_behind() -> int:
    """How many calls this process gave up on are still running."""
    return _left_behind


def bounded(timeout: float, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """call(*args, **kwargs), or TimeoutError once it has taken `timeout` seconds (NOTE
    [ calls left behind ])."""
    return watched(timeout, lambda _step: call(*args, **kwargs))


def watched(timeout: float, steps: Callable[[Callable[[], None]], T]) -> T:
    """`steps(step)` on a thread of its own, where `step()` marks progress: TimeoutError once
    `timeout` seconds pass without a step. After that, the thread's next `step()` raises
    `Abandoned` in the thread itself, which cleans up what it holds."""
    global _left_behind
    with _counted:
        if _left_behind >= MAX_LEFT_BEHIND:
            raise TimeoutError(
                f"{_left_behind} calls to the store have not returned: no new call is made "
                "until they do"
            )
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    given_up = threading.Event()
    last = [time.monotonic()]

    def step() -> None:
        if given_up.is_set():
            raise Abandoned("the caller gave up waiting")
        last[0] = time.monotonic()

    def run() -> None:
        global _left_behind
        try:
            outcome.append((True, steps(step)))
        except BaseException as exc:  # handed to the waiting thread as it is
            outcome.append((False, exc))
        with _counted:
            done.set()
            if given_up.is_set():
                _left_behind -= 1

    threading.Thread(target=run, name="etl-store", daemon=True).start()
    while not done.wait(max(0.0, last[0] + timeout - time.monotonic())):
        if time.monotonic() - last[0] < timeout:
            continue  # a step came while this thread slept
        with _counted:
            if done.is_set():
                break
            given_up.set()
            _left_behind += 1
        raise TimeoutError(f"no answer from the store in {timeout:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast(T, value)


def listing(fs: Any, root: str, page_timeout: float | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object under `root` as (path, details), streamed page by page (s3fs, gcsfs,
    adlfs: 1,000 or so keys a request), each page within `page_timeout` seconds.

    NOTE [ a listing in pages ]: a prefix of millions of objects is a thousand requests and
    more; as one call (`fs.find`) it holds every object's details at once and must end
    within one time limit, which a healthy store that is merely large fails. In pages, only
    a page is held, a store that stops answering is named within one page's time, and a
    listing of any length goes on while each page comes. The drivers page inside `find` and
    expose no pages, so each driver's own listing call is used (`_objects`); another
    driver's listing comes whole, within `page_timeout`. None waits as long as it takes.
    """
    objects = _objects(fs, root)
    if objects is None:
        if page_timeout is None:
            found = fs.find(root, detail=True, withdirs=False)
        else:
            found = bounded(page_timeout, fs.find, root, detail=True, withdirs=False)
        yield from found.items()
        return
    from fsspec.asyn import sync

    try:
        while True:
            try:  # an object of the page in hand, or the next page's request
                info = sync(fs.loop, asyncio.wait_for, objects.__anext__(), page_timeout)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise TimeoutError(f"a page of the listing took over {page_timeout} s") from None
            yield info["name"], info
    finally:
        with contextlib.suppress(Exception):
            sync(fs.loop, objects.aclose, timeout=page_timeout)


def _objects(fs: Any, root: str) -> Objects | None:
    """The objects under `root` as the driver's own paged listing gives them (fsspec info
    dicts), or None for a driver whose pages we do not know."""
    kind = type(fs).__module__.split(".", 1)[0]
    if not hasattr(fs, "loop") or getattr(fs, "version_aware", False):
        return None
    bucket, key = fs.split_path(root)[:2]
    prefix = f"{key.rstrip('/')}/" if key else ""
    if kind == "s3fs":
        return cast(Objects, fs._iterdir(bucket, prefix=prefix, delimiter=""))
    if kind == "gcsfs":
        return _gcs_objects(fs, bucket, prefix)
    if kind == "adlfs":
        return _azure_objects(fs, bucket, prefix)
    return None


async def _gcs_objects(fs: Any, bucket: str, prefix: str) -> Objects:
    token: dict[str, str] = {}
    while True:
        page = await fs._call(
            "GET", "b/{}/o", bucket, json_out=True, prefix=prefix, maxResults=1000, **token
        )
        for item in page.get("items", []):
            yield fs._process_object(bucket, item)
        if not page.get("nextPageToken"):
            return
        token = {"pageToken": page["nextPageToken"]}


async def _azure_objects(fs: Any, container: str, prefix: str) -> Objects:
    client = fs.service_client.get_container_client(container)
    listed = client.list_blobs(
        name_starts_with=prefix or None, include=["metadata"], results_per_page=1000
    )
    pages = listed.by_page()
    async for page in pages:
        async for blob in page:
            if (blob.metadata or {}).get("is_directory") == "true":
                continue  # adlfs's marker of an empty folder, no object
            yield {
                "name": f"{container}/{blob.name}",
                "size": blob.size,
                "type": "file",
                "last_modified": blob.last_modified,
                "etag": blob.etag,
            }
