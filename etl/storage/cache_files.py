"""The cache folder's files on disk: a folder nobody else can write unless it is shared on
purpose, files created exclusively and never through a symlink, liveness by lock.

NOTE [ a cache nobody can poison ]: what lies in the cache is trusted once verified, so the
folder must be one that nobody but its users can write:

- **Private** (the default): the cache folder must be the user's own and writable by nobody
  else; folders made in it are 0700, files 0600. Anything else is refused in one line that
  names the folder and says how to share it on purpose.
- **Shared** (`StoreOptions(shared_cache=True)` or `ETL_CACHE_SHARED=1`, e.g. one cache per
  node for a team): the folder may be another user's and writable by its group (whose
  members trust each other's verified downloads), never by everyone; folders made in it are
  2770 (its group inherited), files 0640, so every member reads what another fetched.

In either: a temporary file is created exclusively with an unpredictable name (`mkstemp`); a
lock is opened with O_NOFOLLOW; a file is counted cached only if it is a plain file, never a
symlink (an atomic rename replaces a link, never writes through it). Whether a download under
way is alive is whether a process holds the lock on its file (`flock`, which the kernel drops
when the process dies), never a pid, which another container on the same cache can reuse.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from etl.errors import ShardError

SHARED_ENV = "ETL_CACHE_SHARED"
"""Set to 1 to say the cache folder is shared on purpose (`StoreOptions.shared_cache`)."""
TMP_PREFIX = ".tmp-"


def shared_by_default() -> bool:
    return os.environ.get(SHARED_ENV, "").strip().lower() in ("1", "true", "yes")


def _folder_mode(shared: bool) -> int:
    return 0o2770 if shared else 0o700


def _file_mode(shared: bool) -> int:
    return 0o640 if shared else 0o600


def safe_folder(path: Path, top: Path, shared: bool) -> Path:
    """`path` (`top`, the cache folder, or a folder under it) made and checked: `top` and
    each folder from it down to `path` created if need be and refused (ShardError naming it)
    if another user could write it (NOTE [ a cache nobody can poison ]). Below `top` no
    folder may be a symlink; `top` itself may be one (a cache on a larger disk)."""
    _make(top, shared, parents=True)
    _check(top, os.stat(top), shared)
    here = top
    for part in path.relative_to(top).parts:
        here = here / part
        _make(here, shared)
        info = os.lstat(here)
        if not stat.S_ISDIR(info.st_mode):
            raise ShardError(f"{here}: not a folder (a symlink?) in the cache: refused")
        _check(here, info, shared)
    return path


def _make(folder: Path, shared: bool, parents: bool = False) -> None:
    if parents:
        folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        return
    os.chmod(folder, _folder_mode(shared))  # exactly, whatever the umask


def _check(folder: Path, info: os.stat_result, shared: bool) -> None:
    mode = stat.S_IMODE(info.st_mode)
    how = f"set {SHARED_ENV}=1 (shared_cache=True) if it is shared on purpose, else use your own"
    if mode & stat.S_IWOTH:
        raise ShardError(
            f"{folder}: the cache folder is writable by every user (mode {mode:o}): anyone "
            "could replace what is cached; use a folder only its users can write"
        )
    if shared:
        return
    if info.st_uid != os.geteuid():
        raise ShardError(
            f"{folder}: the cache folder belongs to another user (uid {info.st_uid}): {how}"
        )
    if mode & stat.S_IWGRP:
        raise ShardError(
            f"{folder}: the cache folder is writable by its group (mode {mode:o}): {how}"
        )


def exclusive_temp(folder: Path, name: str, shared: bool) -> tuple[int, Path]:
    """A new file `.tmp-<name>-<random>` in `folder`, created exclusively (never an existing
    file, never through a symlink), open for writing and locked (LOCK_EX: alive while the
    descriptor is open, `abandoned`): (descriptor, path)."""
    fd, path = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}-", dir=folder)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.fchmod(fd, _file_mode(shared))
    return fd, Path(path)


FRESH_SECONDS = 10.0
"""A `.tmp-` file younger than this is never judged abandoned: between its creation and its
lock (`exclusive_temp`) another process could take the lock and remove it under its writer."""


def temp_name_of(name: str) -> str | None:
    """The name a `.tmp-` file of `exclusive_temp` was made for, None for any other name."""
    if not name.startswith(TMP_PREFIX):
        return None
    return name[len(TMP_PREFIX) :].rpartition("-")[0] or None


def open_no_follow(path: Path, flags: int, shared: bool) -> int:
    """os.open(path, flags) that never follows a symlink: ShardError naming it if one is
    there (only a user who can write the cache folder could have put it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, _file_mode(shared))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ShardError(f"{path}: a symlink where the cache keeps a file: refused") from None
        raise
    if flags & os.O_CREAT:
        with suppress(PermissionError):  # exactly, whatever the umask; another's stays theirs
            os.fchmod(fd, _file_mode(shared))
    return fd


def lock_file(path: Path, shared: bool) -> int:
    """A descriptor to flock `path` by (created if need be; read-only, so the other users
    of a shared cache can lock a file one of them made)."""
    return open_no_follow(path, os.O_RDONLY | os.O_CREAT, shared)


@contextmanager
def locked(path: Path, shared: bool = False) -> Iterator[None]:
    """An exclusive flock on `path` for the block: released by the kernel when the process
    dies, so a killed downloader never blocks the others."""
    fd = lock_file(path, shared)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def is_cached(path: Path) -> bool:
    """Whether `path` is a plain file (never a symlink, whatever it points at)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def abandoned(path: Path) -> bool:
    """Whether no process holds the lock on the download file `path`, at least
    `FRESH_SECONDS` old: its writer died (or never took it), so it never finishes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone already, or not ours to judge
    try:
        if os.fstat(fd).st_mtime > time.time() - FRESH_SECONDS:
            return False  # just made: its writer may not hold its lock yet
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def same_file(a: Path, b: Path) -> bool:
    """Whether `b` is a plain file with `a`'s bytes (both small: a commit record)."""
    return is_cached(b) and a.read_bytes() == b.read_bytes()


def replace_folder(staging: Path, folder: Path) -> None:
    """`staging` renamed to `folder`; an older copy there is renamed away first (its open
    files stay readable) and removed."""
    if folder.is_symlink():
        folder.unlink()
    elif folder.is_dir():
        old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-", dir=folder.parent))
        with suppress(OSError):
            os.rename(folder, old / "copy")
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(staging, folder)
    except OSError:
        if not folder.is_dir():  # another process renamed its copy first: use that
            raise


def remove_tree(folder: Path) -> None:
    if folder.is_dir():
        for child in folder.iterdir():
            child.unlink(missing_ok=True)
        folder.rmdir()


@dataclass(frozen=True)
class Reservation:
    """Room reserved in the cache for one shard's download: its `.tmp-` file, made with an
    unpredictable name and locked (`fd`) until the download ends, so another process counts
    it while it lives and removes it once its process died (`cache_files.abandoned`)."""

    shard: int
    path: Path
    fd: int

    @staticmethod
    def made(shard: int, final: Path, shared: bool) -> Reservation:
        fd, path = exclusive_temp(final.parent, final.name, shared)
        return Reservation(shard, path, fd)

    def drop(self) -> None:
        """Remove the file, then let go of its lock."""
        self.path.unlink(missing_ok=True)
        with suppress(OSError):
            os.close(self.fd)
