"""Why a sample is not packed: every reject reason, and which of them the file's bytes decide.

One registry for the rejects table, the stages that raise `Reject`, and the plan that remembers
content-decided rejects across runs. Imported by workers: nothing heavier than the stdlib.
"""

from __future__ import annotations

REJECT_REASONS: dict[str, str] = {
    # decode
    "unreadable": "not an image Pillow can identify (empty, another file type, damaged header)",
    "format_not_allowed": "an image format not in decode.formats (e.g. XBM, text PNM, EPS)",
    "truncated": "the data ends before the last pixel (never padded with grey or black)",
    "corrupt": "the decoder reported damaged data (bad compressed stream, code or structure)",
    "too_large": "width x height above decode.max_pixels or Pillow's decompression-bomb limit",
    "multi_frame": "an animation or multi-page file while decode.multi_frame is 'reject'",
    "unsupported_mode": "a pixel format with no faithful 8-bit conversion (float, 32-bit int)",
    # validate
    "too_small": "source height or width below validate.min_size",
    "aspect": "source max(w/h, h/w) above validate.max_aspect",
    "duplicate": "same content hash as another source (validate.duplicates)",
    # call stages and the final shape check
    "bad_output": "a stage produced an array of the wrong shape, dtype or channel count",
    "stage_error": "a call stage raised an exception",
    # executor and sources
    "io_error": "the source file could not be read",
    "not_a_file": "a FIFO, socket, device or folder where a file was expected (never opened)",
    "file_too_large": "a file larger than source.max_file_bytes (never read)",
    "io_timeout": "reading the file took longer than source.io_timeout (a hung mount?)",
    "folder_unreadable": "a folder that cannot be listed (permission, path too long, I/O error)",
    "bad_row": "a listing row that is malformed or has an empty path",
    "changed": "the source file changed between listing and reading it",
    "unknown_label": "the label is empty or not one of source.classes",
    "no_class": "the file is not inside a class folder",
    "missing": "a file the listing names does not exist or is not a regular file",
    "outside_root": "a path or symbolic link that leads outside the source root",
    "unnameable_key": "an object key with an empty, '.' or '..' segment: no local path names it",
    "pickle": "an LMDB value is a Python pickle and source.allow_pickle is not set",
    "bad_column": "a value of a declared column (columns:) that does not fit its type, or a "
    "required one that is missing",
}
"""Every reason a single image can be dropped for; the one registry the rejects table uses."""


class Reject(Exception):
    """A per-image rejection; the executor turns it into a row of the rejects table."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}; add it to REJECT_REASONS")
        # NOTE: both values go to Exception.__init__ so the exception pickles across processes.
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


CONTENT_REJECTS = frozenset(
    {
        "unreadable",
        "truncated",
        "corrupt",
        "too_large",
        "multi_frame",
        "unsupported_mode",
        "too_small",
        "aspect",
        "bad_output",
        "stage_error",
    }
)
"""Reject reasons that depend only on the file's bytes and the output-shaping config, so an
unchanged file keeps them without being decoded again. The others are re-decided every run."""

READ_REJECTS = frozenset({"io_error", "not_a_file", "file_too_large", "io_timeout"})
"""Reasons a source's bytes could not be read at all (`etl.engine.fill` gives them, from
`readers.Refused` or any other OSError): the stages never saw it."""
