"""Views: a selection over one packed dataset version, kept as a predicate rather than as data,
so a subset is named, pinned and shared without rewriting a byte (issue #42).

A view says which dataset and version (the latest when opened, if not pinned) and which rows:
splits, classes, sample ids, source patterns and a SQL condition over the manifest, the
per-sample columns included. A view of a view keeps its base's rows that also pass its own
predicate. Its `fingerprint` (dataset version + every predicate of the chain, canonical JSON)
goes into a loader's resume state, so a resumed run refuses a view that changed.

In Python: `View("artifacts", split="train", where="score > 0.5")`; in a file (`View.load`):

    dataset: ../artifacts        # relative to the file
    version: 3                   # optional: the latest when opened
    split: train                 # or a list
    classes: [cat, dog]
    sources: ["cam1/*"]          # fnmatch patterns on `source`
    ids: [0a1b2c3d4e5f6a7b]
    where: "score > 0.5 AND len(boxes) > 0"
    base: train.yaml             # a view of that view (same dataset and version)
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import ConfigError, SelectionError
from etl.format.table_ops import bool_mask

if TYPE_CHECKING:
    from etl.format.contents import VersionContents

PREDICATE_KEYS = ("split", "classes", "sources", "ids", "where")
"""What a view may say of its rows, in the order they are applied."""
VIEW_KEYS = ("dataset", "version", *PREDICATE_KEYS, "base")
MAX_BASES = 32
"""A view file's chain of bases is refused beyond this (no RecursionError, ever)."""


@dataclass(frozen=True)
class View:
    """Rows of one dataset version that pass every predicate given (and the base view's)."""

    dataset: str = ""
    """A dataset folder or URL as written; a view with a `base` takes the base's. Whether it
    is a URL, and where a relative folder is, `etl.storage.location.open_location` decides."""
    version: int | None = None
    split: tuple[str, ...] | None = None
    classes: tuple[str | int, ...] | None = None
    sources: tuple[str, ...] | None = None
    """fnmatch patterns on `source` ('*' matches '/' too), case-sensitive."""
    ids: tuple[str, ...] | None = None
    where: str | pc.Expression | None = None
    """A SQL condition over the manifest's columns (duckdb; see `etl.format.contents`), or a
    pyarrow compute Expression (in Python; its text is what the fingerprint records)."""
    base: View | None = field(default=None, repr=False)
    folder: str = ""
    """Where a relative `dataset` is read from: a view file's own folder ('' in Python)."""

    def __post_init__(self) -> None:
        for key in ("split", "classes", "sources", "ids"):
            value = getattr(self, key)
            if isinstance(value, str | int) and not isinstance(value, bool):
                object.__setattr__(self, key, (value,))
            elif value is not None:
                object.__setattr__(self, key, tuple(value))
        if self.base is not None:
            if self.dataset and _written(self) != _written(self.base):
                raise ConfigError(
                    f"a view of a view reads its base's dataset {self.base.dataset!r}, "
                    f"not {self.dataset!r}"
                )
            if self.version is not None and self.version != self.base.version:
                raise ConfigError(
                    f"a view of a view reads its base's version {self.base.version}, "
                    f"not {self.version}"
                )
            object.__setattr__(self, "dataset", self.base.dataset)
            object.__setattr__(self, "folder", self.base.folder)
            object.__setattr__(self, "version", self.base.version)
        if not self.dataset:
            raise ConfigError("a view needs a dataset (a folder or URL) or a base view")
        if self.version is not None and (
            isinstance(self.version, bool) or not isinstance(self.version, int)
        ):
            raise ConfigError(f"version must be a number, not {self.version!r}")
        if self.where is not None and not isinstance(self.where, str | pc.Expression):
            raise ConfigError(
                'where must be a SQL condition as text, e.g. "score > 0.5", or a pyarrow Expression'
            )

    def narrowed(self, **predicate: Any) -> View:
        """A view of this view: its rows that also pass `predicate` (PREDICATE_KEYS)."""
        unknown = sorted(set(predicate) - set(PREDICATE_KEYS))
        if unknown:
            raise TypeError(f"a view narrows by {', '.join(PREDICATE_KEYS)}, not {unknown}")
        return View(base=self, **predicate)

    def pinned(self, version: int) -> View:
        """This view (and its bases) at `version`, as opened."""
        if self.base is None:
            return replace(self, version=version)
        return View(base=self.base.pinned(version), **self.predicate())

    def predicate(self) -> dict[str, Any]:
        """This view's own predicate (not its base's), as lists and text."""
        found: dict[str, Any] = {}
        for key in PREDICATE_KEYS:
            value = getattr(self, key)
            if isinstance(value, pc.Expression):
                found[key] = f"arrow: {value}"
            elif value is not None:
                found[key] = list(value) if isinstance(value, tuple) else value
        return found

    def chain(self) -> list[dict[str, Any]]:
        """Every predicate from the first base to this view."""
        before = self.base.chain() if self.base is not None else []
        return [*before, self.predicate()]

    def fingerprint(self, version: int) -> str:
        """A digest of the version and every predicate of the chain (what a resumed run
        must find unchanged)."""
        canonical = json.dumps(
            {"version": version, "chain": self.chain()}, sort_keys=True, separators=(",", ":")
        )
        return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()

    def mask(self, version: VersionContents) -> NDArray[np.bool_]:
        """One boolean per sample of `version`: in this view. An unknown split, class or id is
        a SelectionError listing the valid ones, as `Catalog.select` says it."""
        mask = self.base.mask(version) if self.base is not None else None
        own = version.mask(self.split, self.classes, self.where)
        if self.sources is not None:
            own &= _matching(version.table.column("source"), self.sources)
        if self.ids is not None:
            ids = version.table.column("sample_id")
            wanted = pa.array([str(i) for i in self.ids], pa.string())
            chosen = bool_mask(pc.is_in(ids, value_set=wanted))
            unknown = sorted(set(wanted.to_pylist()) - set(ids.filter(chosen).to_pylist()))
            if unknown:
                raise SelectionError(
                    f"{version.manifest.path}: no sample with sample_id {unknown[:5]}"
                    + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                )
            own &= chosen
        return own if mask is None else mask & own

    @classmethod
    def load(cls, path: Path | str, _within: tuple[Path, ...] = ()) -> View:
        """The view a YAML file describes (see the module docstring); ConfigError naming the
        file, line and key for anything it cannot be (a chain of bases that comes back to a
        file, or deeper than MAX_BASES, too)."""
        from etl.yaml_file import read_yaml  # NOTE: here: it needs PyYAML

        path = Path(path)
        if path.resolve() in _within:
            chain = " -> ".join(p.name for p in (*_within, path.resolve()))
            raise ConfigError(f"{path}: a view's bases come back to it ({chain})")
        if len(_within) >= MAX_BASES:
            raise ConfigError(f"{path}: bases deeper than {MAX_BASES} views")
        data, lines = read_yaml(path, ", ".join(VIEW_KEYS))
        unknown = [k for k in data if k not in VIEW_KEYS]
        if unknown:
            line = lines.get((unknown[0],), 1)
            raise ConfigError(f"{path}:{line}: unknown key {unknown[0]!r}; keys: {VIEW_KEYS}")
        values = dict(data)
        for key in ("split", "classes", "sources", "ids"):
            if key in values:
                values[key] = _names(values[key], key, path, lines)
        if "dataset" in values:
            values["folder"] = str(path.parent)
        if "base" in values:
            base = values["base"]
            if not isinstance(base, str):
                raise ConfigError(f"{path}:{lines.get(('base',), 1)}: base is a view file")
            base_path = Path(base) if Path(base).is_absolute() else path.parent / base
            values["base"] = cls.load(base_path, (*_within, path.resolve()))
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _written(view: View) -> str:
    """A view's dataset as its file wrote it, read from its folder: what a view of a view and
    its base must agree on (the same folder or URL, written alike)."""
    return os.path.normpath(os.path.join(view.folder, view.dataset))


def _names(value: Any, key: str, path: Path, lines: Mapping[tuple[Any, ...], int]) -> Any:
    items = [value] if isinstance(value, str | int) and not isinstance(value, bool) else value
    if not isinstance(items, list) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in items
    ):
        raise ConfigError(f"{path}:{lines.get((key,), 1)}: {key} is a name or a list of names")
    return tuple(items)


def _matching(sources: pa.ChunkedArray, patterns: Sequence[str]) -> NDArray[np.bool_]:
    """Whether each source matches any fnmatch pattern (one regular expression for all)."""
    expression = "|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)
    try:
        re.compile(expression)
    except re.error as exc:
        raise SelectionError(f"sources {list(patterns)}: not a pattern ({exc})") from None
    found = pc.match_substring_regex(sources, "^(?:" + expression.replace("\\Z", "$") + ")")
    return bool_mask(found)
