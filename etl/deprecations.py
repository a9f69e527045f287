"""Public names that were renamed keep working: each old name warns once per process, naming
its new one (a keyword of `PackedDataset.open`, a value of `verify`)."""

from __future__ import annotations

import warnings

_WARNED: set[str] = set()


def warn_once(old: str, new: str, stacklevel: int = 4) -> None:
    """A DeprecationWarning that `old` is now `new`, the first time `old` is used; `stacklevel`
    as `warnings.warn`'s, counted from here (3: the caller of the function that calls this)."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel)
