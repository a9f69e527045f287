"""Publishing a version packed in a local folder to a dataset in object storage.

NOTE [ publishing to a store ]: an object store has no rename and no lock. What it has (S3 and
the stores that speak its If-None-Match, and a local disk) is a put that succeeds only while
the key does not exist: fsspec's `pipe_file(..., mode="create")`. So one object decides a
version, its commit record `versions/vNNNNNN/commit.json`, put last and only if absent, and
everything before it goes to names no other writer uses:

- the version's shards carry the attempt's writer tag: 'shards/v000005-1f2e3d4c-00000.npy';
- its Arrow files go to the hidden folder `versions/.v000005-1f2e3d4c/`, which the record names
  (`files_at`) and no reader lists as a version.

Each file is uploaded, then read back from the store and its size and checksum compared with
the local file's, before the record is put. A put of the record that timed out or failed may
still land, so nothing is removed until the store has said whose record holds the version
(NOTE [ a record's fate ]). Of two writers racing for a version, one put of
the record succeeds; the other removes what it uploaded and says to run again. A writer killed
at any point leaves only tagged objects that no version names: the attempt file in its work
folder names them, and the next run from that folder removes them before anything else.

What each backend guarantees: s3fs sends If-None-Match (AWS S3 since 2024, MinIO, moto's
server), gcsfs ifGenerationMatch=0, adlfs If-None-Match: * (`overwrite=False`), fsspec's local
file system opens with O_EXCL: one winner, always (`etl.storage.transport.CONDITIONAL_PUTS`,
tested against moto, fake-gcs-server and Azurite). Any other protocol is refused as an
output.dir: fsspec's fallback for a driver without a create mode is a check-then-write, which
two writers within the same moment can both pass.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from etl.errors import EtlError, LockError, OutputError
from etl.format.checksums import TAMPER_DIGEST
from etl.format.manifest import RECORDED_FILES, VERSIONS_DIR, read_manifest, version_name
from etl.format.record import FILES_AT, RECORD_FILE, relocated
from etl.format.shards import SHARDS_DIR, WRITER_TAG, shard_version
from etl.progress import Progress
from etl.storage.downloads import DOWNLOAD_CHUNK
from etl.storage.records import staging_name, staging_name_of
from etl.storage.store import DOWNLOADS, StoreDataset
from etl.storage.transport import why

RECORD_TRIES = 3
"""Puts of a version's record, only if absent, before its fate is left to the next run."""
RECORD_BACKOFF = 1.0
"""Seconds before the second put of a record; twice that before the third."""
ATTEMPT_FILE = "attempt.json"
"""In a run's work folder while it publishes: the version and writer tag of what it uploads."""


@dataclass(frozen=True)
class Attempt:
    """One try at publishing `version`, its objects tagged `writer` (8 hex digits)."""

    version: int
    writer: str

    @property
    def staging(self) -> str:
        return staging_name(self.version, self.writer)

    def save(self, work: Path) -> None:
        """Written, and flushed to disk, before the first byte is uploaded."""
        path = work / ATTEMPT_FILE
        with open(path, "w") as f:
            json.dump({"version": self.version, "writer": self.writer}, f)
            f.flush()
            os.fsync(f.fileno())

    @staticmethod
    def saved(work: Path) -> Attempt | None:
        """The attempt a killed run left in `work`, None if none or if the file is not one
        this module wrote: damaged, a writer tag that is not 8 hex digits (a '*' would widen
        what `forget` removes to other writers' objects). What such an attempt uploaded stays
        in the store as objects no version names."""
        try:
            body = json.loads((work / ATTEMPT_FILE).read_bytes())
            version, writer = body["version"], body["writer"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
        if type(version) is not int or not 0 < version < 10**6:
            return None
        if not isinstance(writer, str) or not WRITER_TAG.fullmatch(writer):
            return None
        return Attempt(version, writer)


def publish(store: StoreDataset, local: Path, attempt: Attempt, progress: Progress) -> None:
    """Upload version `attempt.version` of the local dataset `local` (its new shards, its files)
    to `store`, verify each, then put its record only if no writer has published that version.

    LockError when another writer has (what this attempt uploaded is removed first);
    OutputError naming the object for an upload or a check that fails.
    """
    folder = local / VERSIONS_DIR / version_name(attempt.version)
    record = store.in_store(VERSIONS_DIR, version_name(attempt.version), RECORD_FILE)
    if _stored_record(store, record) is not None:
        raise _beaten(store, attempt)
    uploads = [
        (local / name, store.in_store(name), checksum, algorithm)
        for name, checksum, algorithm in _new_shards(local, attempt)
    ] + [
        (folder / name, store.in_store(VERSIONS_DIR, attempt.staging, name), digest, TAMPER_DIGEST)
        for name, digest in _recorded_digests(folder).items()
    ]
    progress.start("upload", len(uploads))
    sent = False
    try:
        with ThreadPoolExecutor(max_workers=DOWNLOADS, thread_name_prefix="etl-upload") as pool:
            for done in [pool.submit(_upload, store, *upload) for upload in uploads]:
                done.result()
                progress.advance(1)
        sealed = relocated(folder, attempt.staging)
        if any(number >= attempt.version for number in store.committed()):
            # a later version exists: this attempt's version was published and then compacted
            # away (its record removed), and a put now would bring it back on an old base
            raise _beaten(store, attempt)
        sent = True
        _put_record(store, record, sealed, attempt)
    except BaseException as exc:
        if sent and not isinstance(exc, LockError):
            raise  # NOTE [ a record's fate ]: it may still land, so nothing is removed
        with suppress(EtlError):
            forget(store, attempt)
        if isinstance(exc, OutputError) and _published_by_another(store, record, attempt):
            # NOTE: the winner's sweep removes a loser's tagged objects, maybe while the loser
            # still uploads or reads them back: its failure then is the race it lost
            raise _beaten(store, attempt) from None
        raise
    finally:
        progress.stop()


def _put_record(store: StoreDataset, record: str, sealed: bytes, attempt: Attempt) -> None:
    """Put `sealed` at `record` only if absent, until the store settles the record's fate:
    returns once it holds this attempt's record; LockError when it holds another's.

    NOTE [ a record's fate ]: a put that timed out or failed may still land: the store may
    act on a request it answers late, or never. Removing the attempt's files then could leave
    a published record naming files that are gone. So the put is tried again, only if absent,
    which settles it: a retry that succeeds, or a refusal followed by reading the record back,
    tells whose record holds the version, and once one holds it no late put can land. Where
    no try settles it, nothing is removed: OutputError, the attempt stays in the work folder,
    and the next run (this process gone, its puts with it) reads the record and cleans up
    only if the version is not this attempt's."""
    failures: list[BaseException] = []
    for tries in range(RECORD_TRIES):
        if tries:
            time.sleep(RECORD_BACKOFF * tries)
        try:
            store.bounded(store.fs.pipe_file, record, sealed, mode="create")
            return
        except FileExistsError:
            pass  # this attempt's earlier put, or another writer's: read whose
        except Exception as exc:
            failures.append(exc)
        try:
            stored = _stored_record(store, record)
        except OutputError as exc:
            failures.append(exc)
            continue
        if stored == sealed:
            return
        if stored is not None:
            raise _beaten(store, attempt)
    raise OutputError(
        f"{record}: the store did not settle the version's record in {RECORD_TRIES} tries "
        f"({why(failures[-1])}); a put may still land, so nothing was removed: run again, "
        f"and the next run publishes or removes version {attempt.version}'s files"
    )


def _published_by_another(store: StoreDataset, record: str, attempt: Attempt) -> bool:
    """Whether another attempt's record of `attempt.version` is in the store now."""
    try:
        stored = _stored_record(store, record)
        return stored is not None and json.loads(stored).get(FILES_AT) != attempt.staging
    except (EtlError, ValueError, AttributeError):
        return False


def forget(store: StoreDataset, attempt: Attempt) -> bool:
    """Remove what `attempt` uploaded, unless its record was published (then it is the
    version's). Returns whether it was published. OutputError if the store cannot be asked."""
    record = store.in_store(VERSIONS_DIR, version_name(attempt.version), RECORD_FILE)
    stored = _stored_record(store, record)
    if stored is not None:
        try:
            published = json.loads(stored).get(FILES_AT)
        except (ValueError, AttributeError):
            published = None
        if published == attempt.staging:
            return True
    pattern = store.in_store(SHARDS_DIR, f"v{attempt.version:06d}-{attempt.writer}-*.npy")
    try:
        leftovers = store.bounded(store.fs.glob, pattern)
        leftovers += store.bounded(store.fs.find, store.in_store(VERSIONS_DIR, attempt.staging))
        if leftovers:
            store.bounded(store.fs.rm, sorted(set(leftovers)))
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise OutputError(
            f"{store.url}: cannot remove what an unfinished attempt at version "
            f"{attempt.version} uploaded ({why(exc)})"
        ) from None
    return False


_TAGGED_SHARD = re.compile(r"^v(\d{6})-([0-9a-f]{8})-\d{5}\.npy$")


def sweep(store: StoreDataset) -> int:
    """Remove what attempts that lost left in the store, whoever made them: a tagged shard or
    a staging folder of a version that is published under another tag. Returns how many.

    Safe beside live writers: an attempt at a version already published can only fail (its
    record's put), so nothing it uploaded will ever be named. What a writer killed on another
    node left for the version after the latest stays until that version is published.
    OutputError if the store cannot be listed or cleaned."""
    try:
        store.fs.invalidate_cache(store.in_store())
        shards = store.bounded(store.fs.find, store.in_store(SHARDS_DIR))
        folders = store.bounded(store.fs.ls, store.in_store(VERSIONS_DIR), detail=False)
    except FileNotFoundError:
        return 0
    except Exception as exc:
        raise OutputError(f"{store.url}: cannot list it ({why(exc)})") from None
    candidates: dict[int, list[tuple[str, str]]] = {}
    for path in shards:
        tagged = _TAGGED_SHARD.match(path.rsplit("/", 1)[-1])
        if tagged:
            candidates.setdefault(int(tagged[1]), []).append((tagged[2], path))
    for path in folders:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        number = staging_name_of(name)
        if number is not None:
            candidates.setdefault(number, []).append((name.rsplit("-", 1)[1], path))
    lost: list[str] = []
    for number, objects in sorted(candidates.items()):
        record = store.in_store(VERSIONS_DIR, version_name(number), RECORD_FILE)
        stored = _stored_record(store, record)
        if stored is None:
            continue  # not published: a live writer's, or a dead one's until it is
        try:
            files_at = json.loads(stored).get(FILES_AT)
        except (ValueError, AttributeError):
            continue  # a damaged record: the audit names it; nothing is removed on its word
        published = files_at.rsplit("-", 1)[1] if isinstance(files_at, str) else None
        lost += [path for tag, path in objects if tag != published]
    if lost:
        try:
            store.bounded(store.fs.rm, lost, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise OutputError(f"{store.url}: cannot remove lost attempts ({why(exc)})") from None
    return len(lost)


def _new_shards(local: Path, attempt: Attempt) -> list[tuple[str, str, str]]:
    """(name, checksum, algorithm) of each shard the attempt wrote: those of its version."""
    manifest = read_manifest(local, attempt.version)
    algorithm, table = manifest.meta.checksum, manifest.shards
    return [
        (name, checksum, algorithm)
        for name, checksum in zip(
            table.column("shard").to_pylist(), table.column("checksum").to_pylist(), strict=True
        )
        if shard_version(Path(name).name) == attempt.version
    ]


def _recorded_digests(folder: Path) -> dict[str, str]:
    """The TAMPER_DIGEST of each file the local commit record lists."""
    files = json.loads((folder / RECORD_FILE).read_bytes())["files"]
    return {name: files[name][TAMPER_DIGEST] for name in RECORDED_FILES}


def _upload(store: StoreDataset, path: Path, remote: str, digest: str, algorithm: str) -> None:
    """Put `path` at `remote` (multipart when it is larger than a chunk), then read it back:
    the store must hold exactly `path`'s size and `digest`. OutputError naming it if not.
    The upload's writes, its close and its abort run on one thread (NOTE [ calls left
    behind ]); a timeout is a chunk that took `store.timeout`, not the whole file."""
    size = path.stat().st_size

    def put(step: Callable[[], None]) -> None:
        dst = store.fs.open(remote, "wb", block_size=DOWNLOAD_CHUNK)
        try:
            with open(path, "rb") as src:
                while chunk := src.read(DOWNLOAD_CHUNK):
                    step()
                    dst.write(chunk)
            step()
            dst.close()
        except BaseException:
            with suppress(Exception):  # s3fs aborts a multipart upload; a leftover is forgotten
                dst.discard()
            raise

    try:
        store.watched(put)
        stored = store.bounded(store.fs.info, remote).get("size")
    except Exception as exc:
        raise OutputError(f"{remote}: cannot upload ({why(exc)})") from None
    if stored != size:
        raise OutputError(f"{remote}: the store holds {stored} bytes of the {size} uploaded")
    got = store.stored_digest(remote, algorithm, OutputError, size)
    if got != digest:
        raise OutputError(
            f"{remote}: the store's bytes are not the ones uploaded ({algorithm} {got}, "
            f"expected {digest})"
        )


def _stored_record(store: StoreDataset, remote: str) -> bytes | None:
    """The record at `remote` as the store holds it now, None if there is none: a GET, never
    an answer from fsspec's cache of listings."""
    try:
        return bytes(store.bounded(store.fs.cat_file, remote))
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise OutputError(f"{remote}: cannot read it ({why(exc)})") from None


def _beaten(store: StoreDataset, attempt: Attempt) -> LockError:
    return LockError(
        f"{store.url}: another writer published version {attempt.version} while this run "
        "packed; nothing of this run was published: run it again to build on that version"
    )
