"""Public names that were renamed keep working: each old name warns once per process, naming
its new one (a keyword of `PackedDataset.open`, a value of `verify`, a name that left a
package for another module)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

_WARNED: set[str] = set()


def warn_once(old: str, new: str, stacklevel: int = 4) -> None:
    """A DeprecationWarning that `old` is now `new`, the first time `old` is used; `stacklevel`
    as `warnings.warn`'s, counted from here (3: the caller of the function that calls this)."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel)


def forwarding(package: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name in `moved` (name -> the module that holds
    it now) still resolves there, warning once at the importer's line; any other is the usual
    AttributeError."""

    def __getattr__(name: str) -> Any:
        module = moved.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warn_once(f"{package}.{name}", f"{module}.{name}", stacklevel=3)
        return getattr(importlib.import_module(module), name)

    return __getattr__
