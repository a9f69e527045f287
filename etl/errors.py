"""Every failure a user can cause has one class here; the CLI prints its message on one line.

Anything that is not an `EtlError` is a bug in this project and keeps its traceback.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_BARE_USERINFO = re.compile(r"(?<![\w/:])[^\s/@\"':]+:[^\s/@\"']+@")
"""'user:pass@' where a driver quotes a URL's bucket part without its scheme."""
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&](?:sig|signature|se|sv|sp|token|access_token|code|key|secret|password|"
    r"x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential)=)[^&\s'\"]+"
)


_SECRET_OPTION = re.compile(
    r"(?i)(--[\w-]*(?:secret|password|passwd|token|credential|access-key|account-key|sas)"
    r"[\w-]*)(=|\s+)(?!-)\S+"
)
"""A command line's option that takes a secret, with its value (`--secret X`, `--token=X`)."""
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")
"""An AWS access key id, wherever it is written."""


def redacted(text: str) -> str:
    """`text` with what a URL may carry to sign in (`user:pass@`, a SAS token's `sig=`, a
    presigned URL's signature), a command line's secret options' values and AWS access key
    ids replaced by '***': no message, report, record or log repeats them."""
    text = _BARE_USERINFO.sub("***@", _USERINFO.sub(r"\1***@", text))
    text = _SECRET_OPTION.sub(r"\1\2***", _SECRET_PARAMETER.sub(r"\1***", text))
    return _ACCESS_KEY_ID.sub("***", text)


def without_credentials(url: str) -> str:
    """`url` with its user info and secret query parameters taken out (not masked): what a
    run's record keeps to open it again, with credentials from the environment or the
    storage options then (a masked '***@' would not open)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(_USERINFO.sub(r"\1", url))
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if not _SECRET_PARAMETER.search(f"?{k}=x")]  # fmt: skip
    return urlunsplit(parts._replace(query=urlencode(kept)))


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b")


def described(exc: BaseException) -> str:
    """An exception as one line, "Type: message", for a message that names it. A message of
    several lines (a driver's error that embeds a traceback, as fsspec's background prefetcher
    does) keeps its first line and the last error line below it, never the traceback."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text
    below = [line for line in lines[1:] if _ERROR_LINE.match(line)]
    return f"{lines[0]} [{below[-1]}]" if below else lines[0]


class EtlError(Exception):
    """Base of all user-facing errors. `exit_code` is what the CLI exits with. A message is
    `redacted` as it is made, whoever makes it."""

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(redacted(a) if isinstance(a, str) else a for a in args))


class ConfigError(EtlError):
    """pipeline.yaml is malformed, has an unknown key, a wrong type or an impossible value."""


class SourceError(EtlError):
    """The source folder or listing cannot be read as declared."""


class ManifestError(EtlError):
    """A manifest is missing, of an unknown format version, or inconsistent with its shards."""


class SelectionError(EtlError, ValueError):
    """A filter names a split or class the version does not have (a ValueError too, as the
    loaders' callers expect of a bad argument)."""


class ShardError(EtlError):
    """A shard file is missing, truncated, or not the shape/dtype its manifest records."""


class LockError(EtlError):
    """Another writer holds the output directory."""


class ExecutionError(EtlError):
    """The parallel engine failed as a whole (not a single bad image: those become rejects)."""


class WorkerDied(ExecutionError):
    """A worker process died while the engine waited for its results (killed, out of memory):
    `codes` are the exit codes (or 'killed') the engine learnt, as the error says them."""

    def __init__(self, codes: str) -> None:
        super().__init__(f"a worker process died ({codes})")
        self.codes = codes


class WorkerError(RuntimeError):
    """An unexpected failure inside a worker, with the file it was working on: a bug, not a
    user's mistake, so not an `EtlError` (it keeps its traceback)."""


class OutputError(EtlError):
    """The output folder cannot be written: read-only, not permitted, full, or failing."""


OUTPUT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)
"""Failures of writing that the user fixes, not the code: they get one line, not a traceback."""


def output_error(exc: OSError, root: Path) -> OutputError:
    """One line for a failed write under the output folder `root`: what, where, and the fix."""
    where = exc.filename or root
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        writing = f", writing {exc.filename}" if exc.filename else ""
        what = f"{root}: no space left for the output ({exc.strerror}{writing})"
        fix = "free some space or choose another output.dir"
    elif exc.errno == errno.EROFS:
        what, fix = (
            f"{root}: the output is on a read-only file system",
            "choose a writable output.dir",
        )
    elif exc.errno in (errno.EACCES, errno.EPERM):
        what = f"{where}: permission denied writing the output"
        fix = "make output.dir writable for this user or choose another"
    else:
        what, fix = f"{where}: {exc.strerror} writing the output", "check the disk"
    return OutputError(f"{what}; {fix}")


def temporary_error(exc: OSError, folder: Path) -> OutputError:
    """One line for a failed write of temporary files in `folder` (a dry run with no output
    folder yet keeps them in the system's temporary folder, TMPDIR)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = f"{folder}: no space left for temporary files ({exc.strerror})"
    else:
        what = f"{exc.filename or folder}: {exc.strerror} writing temporary files"
    return OutputError(f"{what}; free some space there or set TMPDIR to a folder with room")
