"""A record's payload, for the kinds whose samples are records: the image bytes of a value
(encoded bytes as they are, an array as .npy), fields of an unpickled record, and the pickle
guard that refuses to unpickle unless the config allows it."""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

# --- pickles ------------------------------------------------------------------------------------

PICKLE_ADVICE = (
    "set source.allow_pickle: true only if you trust whoever wrote the environment: "
    "unpickling runs arbitrary code"
)


def is_pickle(data: bytes | memoryview) -> bool:
    """A pickle of protocol 2 to 5 starts with PROTO (0x80) and the protocol number. Checked
    before anything is unpickled; older protocols have no header and fail to decode instead."""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def field_of(record: Any, name: str | int) -> Any:
    """record[name] of an unpickled dict (a str name) or tuple/list (an int); else KeyError."""
    if isinstance(record, dict) and isinstance(name, str) and name in record:
        return record[name]
    if (
        isinstance(record, tuple | list)
        and isinstance(name, int)
        and -len(record) <= name < len(record)
    ):
        return record[name]
    fields = sorted(map(str, record)) if isinstance(record, dict) else f"{len(record)} items"
    raise KeyError(f"no field {name!r} (has {fields})")


def image_bytes(value: Any, what: str) -> bytes:
    """Encoded image bytes as they are, or a uint8 array as .npy bytes (decode reads both)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()
    raise ValueError(f"{what} is {type(value).__name__}, not encoded image bytes or an array")


UNPICKLE_ERRORS = (
    pickle.UnpicklingError,
    ValueError,
    KeyError,
    EOFError,
    TypeError,
    AttributeError,
    ImportError,
)
"""What a damaged or unexpected pickled record raises while we take it apart."""
