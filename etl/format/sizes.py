"""Byte sizes as people write them ('256MiB', '20GB'): for config keys and the loaders' options."""

from __future__ import annotations

import re
from typing import Any

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}


def parse_byte_size(value: Any) -> int:
    """'256MiB' -> 268435456; plain integers are bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '256MiB', got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ValueError(f"expected a size like '256MiB' or '64MB', got {value!r}")
