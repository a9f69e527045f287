"""What a source kind provides: the protocol every module under `etl.sources.kinds` fills in.

The rest of the code asks a kind (`etl.sources.registry.kind_of`) and never branches on its
name. A new kind is its config model (etl/config/sources.py), its module here, and one line
in the registry: see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl.sources.entries import ListContext, SourceListing


@dataclass(frozen=True)
class SourceKind:
    """One source kind. The functions take the kind's own config model, the one in
    etl/config/sources.py whose `kind` is its name (typed `Any` here; a test checks that every
    model has its kind). No kind module needs the models at import: a worker reads through a
    kind's `read` without them (`SourceSpec`)."""

    name: str
    """The config's `source.kind`."""
    list: Callable[[Any, ListContext], SourceListing]
    """Every input, sorted by `source`: a `SourceFile` with its locator, or a `SourceReject`
    saying why it cannot be a sample. Runs in the parent, once a run."""
    read: Callable[[Any, str], bytes]
    """The bytes of one input from its locator, in a worker; OSError when it cannot be read."""
    check: Callable[[Any], None]
    """SourceError naming source.path when it is not what the kind reads; called before a run
    creates anything, so a refused config leaves no output folder behind."""
    by_path: bool
    """Its inputs are files named by their path under `root`: found again by path (also under
    another root, `--source DIR`) and hashed as files, never held whole. The other kinds' inputs
    are records, found again by listing the source again."""
    root: Callable[[Any], Path | str] = lambda config: config.path
    """Where the inputs are found again: for `by_path` kinds the folder a manifest's `source`
    paths are relative to; for the others, the `source.path` listed again (the default)."""
    spooled: bool = False
    """Its records reach the workers only through the spool in the output folder (NOTE [spool]
    in etl/sources/spool.py): workers never read `source.path`."""
    in_place: bool = True
    """Its locators point into the source itself (a file path, an LMDB key), so an input is
    read back without a spool. False: a record is read back only through a spool."""
    walks_path: bool = False
    """Lists every file under `source.path`: an output folder inside it would be listed as
    input on the next run, so it is refused."""
    columns: bool = False
    """Its inputs carry values besides the image (a listing's other columns, a record's other
    keys) that the config's `columns:` can take into the manifest."""
    release: Callable[[], None] | None = None
    """Closes what this process opened of such sources (LMDB environments), at the end of a
    run, so the caller may open them for writing."""


@dataclass(frozen=True)
class SourceSpec:
    """A source as a worker reads its inputs back (`etl.sources.readers`): its kind's `read`
    (pickled by reference) and the config's values as plain data, so a worker unpickles it
    without importing pydantic or the config models (`etl.sources.registry.spec_of`)."""

    kind: str
    by_path: bool
    read: Callable[[Any, str], bytes]
    config: SimpleNamespace
    """The source config's fields by name, as the kind's `read` takes them."""
