"""The `.npy` header, parsed strictly: every malformed header is one `NpyHeaderError`.

numpy's own `read_array_header_*` evaluates the header text with `ast.literal_eval` through
`tokenize`, and a damaged byte surfaces as whatever that raised: `ValueError`, `SyntaxError`,
`tokenize.TokenError`, `MemoryError` for a huge declared length, and more. A shard's header is
a file this tool reads back, so its damage must be one error naming the file; this parser takes
the format apart itself (magic, version, length, then the dict literal) and turns every failure,
of whatever class, into `NpyHeaderError`. Files stay readable by `np.load` without our code.
"""

from __future__ import annotations

import ast
from typing import BinaryIO

import numpy as np

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 1 << 16
"""A header longer than this is refused: numpy writes a few hundred bytes at most."""


class NpyHeaderError(ValueError):
    """A `.npy` header that is not one (the message says what is wrong with it)."""


def read_head(file: BinaryIO) -> bytes:
    """The header bytes of an open `.npy` file, read as numpy reads them: the fixed part, then
    the length it declares (capped), so no more of the file is read (or cached) than that."""
    head = file.read(12)
    if len(head) < 10 or not head.startswith(MAGIC):
        return head
    wide = head[6] in (2, 3)
    length = int.from_bytes(head[8:12] if wide else head[8:10], "little")
    end = (12 if wide else 10) + length
    return head + file.read(max(0, min(end, MAX_HEADER_BYTES) - len(head)))


def parse_header(head: bytes) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran_order, data offset) from the first bytes of a `.npy` file.

    `head` needs to hold the whole header: `MAX_HEADER_BYTES` bytes of the file (or all of it)
    are always enough for a header this accepts.
    """
    if not head.startswith(MAGIC):
        raise NpyHeaderError("no .npy magic at the start of the file")
    if len(head) < 10:
        raise NpyHeaderError(f"the file ends inside its header ({len(head)} bytes)")
    version = (head[6], head[7])
    if version == (1, 0):
        length, start, encoding = int.from_bytes(head[8:10], "little"), 10, "latin1"
    elif version in ((2, 0), (3, 0)):
        if len(head) < 12:
            raise NpyHeaderError(f"the file ends inside its header ({len(head)} bytes)")
        length, start = int.from_bytes(head[8:12], "little"), 12
        encoding = "latin1" if version == (2, 0) else "utf8"
    else:
        raise NpyHeaderError(f"unsupported .npy version {version[0]}.{version[1]}")
    end = start + length
    if end > MAX_HEADER_BYTES:
        raise NpyHeaderError(f"header length {length} is implausible (over {MAX_HEADER_BYTES})")
    if end > len(head):
        raise NpyHeaderError(f"header length {length} runs past the end of the file")
    try:
        text = head[start:end].decode(encoding)
        fields = ast.literal_eval(text)
    except Exception as exc:  # every way a damaged literal fails: see the module docstring
        raise NpyHeaderError(f"header is not a valid literal ({type(exc).__name__})") from None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise NpyHeaderError("header is not a dict of 'descr', 'fortran_order' and 'shape'")
    shape, fortran, descr = fields["shape"], fields["fortran_order"], fields["descr"]
    if not isinstance(shape, tuple) or not all(_is_size(n) for n in shape) or len(shape) > 32:
        raise NpyHeaderError(f"header shape {shape!r} is not a tuple of sizes")
    if not isinstance(fortran, bool):
        raise NpyHeaderError(f"header fortran_order {fortran!r} is not a bool")
    if not isinstance(descr, str):
        raise NpyHeaderError(f"header descr {descr!r} is not a simple dtype")
    try:
        dtype = np.dtype(descr)
    except Exception:  # numpy raises TypeError, ValueError or SyntaxError for bad strings
        raise NpyHeaderError(f"header descr {descr!r} is not a dtype") from None
    return shape, dtype, fortran, end


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
