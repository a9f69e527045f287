"""One writer per dataset directory, enforced with an OS lock that dies with its process.

`flock` is released by the kernel when the holder exits, however it exits, so a lock left by a
killed run is never mistaken for a live one; the pid and host written into the file are only
there to tell the user who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from etl.errors import LockError

LOCK_FILE = ".lock"


class DatasetLock:
    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> DatasetLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise LockError(
                f"{self.path.parent}: another etl process is writing here ({holder}); "
                "wait for it to finish or stop it"
            ) from None
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.write(fd, json.dumps(info).encode())
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _describe(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} since {since}"
    except Exception:  # whatever the lock file holds, naming its holder is only a courtesy
        return "holder unknown"
