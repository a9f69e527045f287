"""Datasets in object storage (`s3://`, `gs://`, any fsspec URL), read through a local cache.

`PackedDataset.open("s3://bucket/ds", cache_dir=...)` (and `etl inspect`, `show`, `versions`
and `diff` given a URL) mirror what they need into the cache and open the copy, so every later
read is a local memory map:

- the version's files (manifest, shards table, rejects, `commit.json`), then checked against
  their commit record as any local version is;
- each shard the selection reads, downloaded whole and verified against the manifest's shard
  checksum before it is named as a shard in the cache.

NOTE [ cache safety ]: nothing half-written is ever trusted. A download goes to a `.tmp-` file
and becomes the cached name only by an atomic rename after its checksum matched; a version
folder is renamed into place whole. A process killed mid-download leaves a `.tmp-` file that
no reader opens and the next download of that shard removes. The processes of one node (ranks,
their workers) share one cache: each shard's download holds an exclusive `flock` on
`<shard>.lock`, so it is downloaded once, and the others find it verified when they get the
lock. A cached shard is not hashed again on open; `etl audit` of the cache folder does that.
So only the cache's users may write it, and a plain file only counts (NOTE [ a cache nobody
can poison ] in `etl.storage.cache_files`); a version re-published in the store (its record
changed) is fetched again, and its changed shards with it.

Without a limit the cache keeps every shard it fetched: a second epoch, or a second run with
the same `version`, reads no byte from the store (`version=None` lists the store's versions
once, to find the latest).

The store is reached only through fsspec (`pip install 'etl-memmap[s3]'` for S3); credentials
and endpoint come from the environment, the profile or `storage_options`, and are never
written anywhere.

NOTE [ names from a store ]: a store is trusted for bytes it can be checked on, never for
where they go. Every name it serves is checked before it is used for anything: a commit
record's files are plain names (`etl.storage.records.recorded_files`), a fetched shards
table's shards are 'shards/<plain name>.npy' before the copy replaces the mirror's, and a
shard becomes a local file only through `shard_file`. A changed shard is removed through the
mirror's own `shards/` folder by file name (`remove_shard_files`), so a hostile table that
names '/home/user/thesis.tex' or 'shards/../../x' (sealed by a record the store made itself)
is refused in one line and removes nothing.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from etl.errors import EtlError, ManifestError, ShardError
from etl.format.coherence import check_shard_name
from etl.format.manifest import (
    VERSIONS_DIR,
    version_name,
    version_number,
)
from etl.format.record import RECORD_FILE
from etl.format.retirement import RETIRED_DIR, record_name, version_of_record
from etl.format.shards import SHARDS_DIR
from etl.storage import calls
from etl.storage.cache_files import (
    TMP_PREFIX,
    exclusive_temp,
    is_cached,
    locked,
    remove_tree,
    replace_folder,
    safe_folder,
    same_file,
    shared_by_default,
)
from etl.storage.downloads import Reach, capped_digest, get_capped
from etl.storage.records import (
    changed_shards,
    check_shard_names,
    files_at,
    read_record,
    recorded_files,
    remove_shard_files,
)
from etl.storage.transport import STORE_TIMEOUT, endpoint_of, filesystem, why

CACHE_ENV = "ETL_CACHE"
"""The environment variable naming the cache folder when `cache_dir` is not given."""
DOWNLOADS = 8
"""Shards downloaded at once: object stores serve parallel GETs faster than one stream."""
RECORD_BYTES = 1 << 20
"""The most a commit record may be (one is a few hundred bytes a file it names): what a
record's download is capped at, before anything says how large it is."""
T = TypeVar("T")


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "etl-memmap")


class StoreDataset:
    """A packed dataset at `url` and its mirror under `cache_dir`: one folder per URL, laid
    out as the dataset itself (`versions/`, `shards/`), so the mirror opens as a local
    dataset."""

    def __init__(
        self,
        url: str,
        cache_dir: Path | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        timeout: float = STORE_TIMEOUT,
        root: Path | None = None,
        shared: bool | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.fs, self.store_root = filesystem(self.url, storage_options, ManifestError)
        reached_at = endpoint_of(self.url, storage_options or {})
        named = self.url if reached_at is None else f"{reached_at}\n{self.url}"
        self.key = hashlib.blake2b(named.encode(), digest_size=8).hexdigest()
        """The mirror's folder name: the URL's, and the endpoint's where one is set (the same
        bucket name on two endpoints is two datasets)."""
        self.top = Path(cache_dir or default_cache_dir())
        self.root = root or self.top / self.key
        """The mirror: a local dataset folder holding what was fetched of `url`."""
        if not self.root.is_relative_to(self.top):
            self.top = self.root
        self.shared = shared_by_default() if shared is None else shared
        self._safe: set[Path] = set()
        """Whether the cache folder is shared on purpose (NOTE [ a cache nobody can poison ])."""
        self.timeout = timeout
        """Seconds one call to the store (a listing, an open, a chunk's read) may take."""

    def folder(self, path: Path) -> Path:
        """`path`, a folder of the mirror, made and checked safe (`cache_files.safe_folder`)
        once per process while it stays (a bounded cache asks before every batch's downloads;
        a work folder is emptied between steps)."""
        if path not in self._safe or not path.is_dir():
            safe_folder(path, self.top, self.shared)
            self._safe.add(path)
        return path

    def in_store(self, *parts: str) -> str:
        """The store's path of a file of the dataset ('shards', 'v000001-00000.npy')."""
        return "/".join([self.store_root.rstrip("/"), *parts])

    def shard_file(self, name: str) -> Path:
        """The mirror's file of shard `name`, a checked name (NOTE [ names from a store ])."""
        return self.root / SHARDS_DIR / check_shard_name(name, self.url)

    def committed(self) -> list[int]:
        """The committed versions in the store, oldest first, maybe none: the version folders
        that hold a commit record (one listing of `versions/`, never an old one from fsspec's
        cache). A writer's files before its version is published are in a hidden folder
        (NOTE [ publishing to a store ]); a version being compacted away loses its record
        first (`etl.maintenance.store_compact`)."""
        folder = self.in_store(VERSIONS_DIR)
        try:
            self.fs.invalidate_cache(folder)
            entries = self.bounded(self.fs.find, folder)  # one paged listing of the prefix
        except FileNotFoundError:
            entries = []
        except Exception as exc:
            raise ManifestError(f"{self.url}: cannot list its versions ({why(exc)})") from None
        numbers = [
            version_number(PurePosixPath(entry).parent.name)
            for entry in entries
            if PurePosixPath(entry).name == RECORD_FILE
            and PurePosixPath(entry).parent.parent.name == VERSIONS_DIR
        ]
        retired = {  # NOTE [ a grace period ]: whole, but nobody lists it
            version_of_record(PurePosixPath(entry).name)
            for entry in entries
            if PurePosixPath(entry).parent.name == RETIRED_DIR
        }
        return sorted({n for n in numbers if n is not None} - retired)

    def versions(self) -> list[int]:
        """The committed versions in the store, oldest first; ManifestError if none."""
        found = self.committed()
        if not found:
            raise ManifestError(f"{self.url}: no manifest version found (run 'etl run' first)")
        return found

    def latest_version(self) -> int:
        """The newest committed version in the store."""
        return self.versions()[-1]

    def fetch_version(self, version: int | None) -> int:
        """The version's files in the mirror; its number. A copy already there is kept while
        the store's record is the one it was fetched with, or the store cannot be asked (a
        pinned version opens offline); a record re-published since is fetched again."""
        number = self.latest_version() if version is None else int(version)
        folder = self.root / VERSIONS_DIR / version_name(number)
        parent = self.folder(folder.parent)
        staging = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{folder.name}-", dir=parent))
        os.chmod(staging, 0o2770 if self.shared else 0o700)
        # one process of a node fetches a version at a time; the others then find it fetched
        with locked(self.root / f".fetch-{folder.name}.lock", self.shared):
            return self._fetch_version(number, folder, staging)

    def _fetch_version(self, number: int, folder: Path, staging: Path) -> int:
        remote = self.in_store(VERSIONS_DIR, version_name(number))
        record_path = f"{remote}/{RECORD_FILE}"
        try:
            try:
                get_capped(
                    self.reach, record_path, staging / RECORD_FILE, ManifestError, cap=RECORD_BYTES
                )
            except ManifestError:
                if folder.is_dir():
                    return number  # the store cannot be asked now: the copy, as fetched
                raise
            self._mirror_retirement(number, staging)
            if same_file(staging / RECORD_FILE, folder / RECORD_FILE):
                return number  # the store's record is the cached one's
            record = read_record(staging / RECORD_FILE, record_path)
            where = f"{self.url}/{VERSIONS_DIR}/{folder.name}"
            kept_at = files_at(record, number, where)
            stored = self.in_store(VERSIONS_DIR, kept_at) if kept_at else remote
            for name, size in recorded_files(record, where).items():
                get_capped(self.reach, f"{stored}/{name}", staging / name, ManifestError, cap=size)
            check_shard_names(staging, where)  # NOTE [ names from a store ]
            remove_shard_files(self.root, changed_shards(folder, staging, self.root))
            replace_folder(staging, folder)  # and the changed shards fetched again
        finally:
            remove_tree(staging)
        return number

    def _mirror_retirement(self, number: int, staging: Path) -> None:
        """The version's retirement record, if the store has one, in the mirror (where a
        reader looks for it to warn); none there if the store has none."""
        name = record_name(number)
        local = self.root / VERSIONS_DIR / name
        fetched = staging / "retired.json"
        try:
            get_capped(
                self.reach, self.in_store(VERSIONS_DIR, name), fetched, ManifestError, cap=1 << 16
            )
        except ManifestError:
            local.unlink(missing_ok=True)
            return
        os.replace(fetched, self.folder(local.parent) / local.name)

    def fetch_shards(
        self,
        names: Sequence[str],
        checksums: Sequence[str],
        algorithm: str,
        sizes: Sequence[int],
    ) -> None:
        """Every shard of `names` in the mirror, verified against its checksum, each download
        capped at its recorded size; downloads run `DOWNLOADS` at a time. ShardError naming
        the shard for one that cannot be fetched, or whose bytes in the store are not the
        ones the manifest recorded."""
        wanted = [
            (name, checksum, int(size))
            for name, checksum, size in zip(names, checksums, sizes, strict=True)
            if not is_cached(self.shard_file(name))
        ]
        if not wanted:
            return
        with ThreadPoolExecutor(max_workers=DOWNLOADS, thread_name_prefix="etl-fetch") as pool:
            fetching = [pool.submit(self._fetch_shard, *one, algorithm) for one in wanted]
            for done in fetching:
                done.result()

    def download_as_stored(
        self, names: Sequence[str], sizes: Sequence[int], on_done: Callable[[int], None]
    ) -> None:
        """Each shard of `names` as the store holds it, into this mirror, NOT verified: only
        for a scratch mirror that is audited and then removed (`etl audit s3://...`), never
        the shared cache. A shard the store does not have is left out, for the audit to name;
        one larger than its recorded size is cut one byte past it, for the audit to name too;
        any other failure is a ShardError naming it. `on_done(1)` after each."""
        size_of = dict(zip(names, sizes, strict=True))

        def download(name: str) -> None:
            final = self.shard_file(name)
            self.folder(final.parent)
            try:
                there = self.bounded(self.fs.exists, self.in_store(name))
            except Exception as exc:
                raise ShardError(f"{self.url}/{name}: cannot look it up ({why(exc)})") from None
            if there:
                get_capped(
                    self.reach,
                    self.in_store(name),
                    final,
                    ShardError,
                    cap=size_of[name] + 1,
                    cut=True,
                )
            on_done(1)

        with ThreadPoolExecutor(max_workers=DOWNLOADS, thread_name_prefix="etl-fetch") as pool:
            for done in [pool.submit(download, name) for name in names]:
                done.result()

    def _fetch_shard(self, name: str, checksum: str, size: int, algorithm: str) -> None:
        final = self.shard_file(name)
        self.folder(final.parent)
        with locked(final.with_name(final.name + ".lock"), self.shared):
            if is_cached(final):  # another process fetched it while this one waited
                return
            fd, partial = exclusive_temp(final.parent, final.name, self.shared)
            try:  # locked: alive while held (`cache_files.abandoned`)
                self.download_shard(name, checksum, size, algorithm, partial)
            finally:
                partial.unlink(missing_ok=True)
                os.close(fd)

    def download_shard(
        self, name: str, checksum: str, size: int, algorithm: str, partial: Path
    ) -> None:
        """Download shard `name` to its `.tmp-` file `partial` (`cache_files.exclusive_temp`),
        at most its recorded `size` bytes, verify it against `checksum` and rename it into
        place. The caller holds the shard's `.lock` (NOTE [ cache safety ])."""
        final = self.shard_file(name)
        got = get_capped(self.reach, self.in_store(name), partial, ShardError, algorithm, cap=size)
        if got != checksum:
            partial.unlink(missing_ok=True)
            raise ShardError(
                f"{self.url}/{name}: its bytes in the store are not the ones the manifest "
                f"recorded ({algorithm} {got}, expected {checksum}): the shard was changed "
                f"after the commit; repair: etl audit {self.url} --repair --config "
                "pipeline.yaml"
            )
        os.replace(partial, final)

    def stored_digest(self, remote: str, algorithm: str, error: type[EtlError], size: int) -> str:
        """The `algorithm` digest of `remote` as the store serves it (nothing written here),
        read up to one byte past `size`, the bytes uploaded: how an upload is verified (a
        longer object's digest differs). An `error` naming it if it cannot be read."""
        return capped_digest(self.reach, remote, algorithm, error, size)

    @property
    def reach(self) -> Reach:
        """How this store's objects are read: its filesystem, its timeout, the cache's mode."""
        return Reach(self.fs, self.timeout, self.shared)

    def bounded(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """call(*args, **kwargs), or TimeoutError once it has taken `timeout` seconds; a
        stuck call is left behind, within a cap (NOTE [ calls left behind ])."""
        return calls.bounded(self.timeout, call, *args, **kwargs)

    def watched(self, steps: Callable[[Callable[[], None]], T]) -> T:
        """`steps(step)` on one thread, TimeoutError once `timeout` seconds pass without a
        `step()` (`etl.storage.calls.watched`)."""
        return calls.watched(self.timeout, steps)
