"""Every source kind, by name: the one place that knows which kinds exist.

The run, audit, repair and the CLI ask `kind_of(config)` what a kind does (how it lists, how a
worker reads an input, whether inputs are files under a root) and never test a kind's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from etl.config import PipelineConfig, SourceConfig
from etl.errors import ConfigError
from etl.sources.entries import ListContext, SourceListing
from etl.sources.kind import SourceKind, SourceSpec
from etl.sources.kinds import folder, listing, lmdb, parquet, python, webdataset

KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        folder.KIND,
        listing.KIND,
        lmdb.KIND,
        python.KIND,
        webdataset.KIND,
        parquet.KIND,
    )
}


def kind_of(config: SourceConfig) -> SourceKind:
    """The kind `config` is of (its `kind` field)."""
    return KINDS[config.kind]


def spec_of(config: SourceConfig) -> SourceSpec:
    """What a worker needs to read `config`'s inputs back, as plain data."""
    kind = kind_of(config)
    return SourceSpec(kind.name, kind.by_path, kind.read, SimpleNamespace(**dict(config)))


def kind_named(name: object) -> SourceKind | None:
    """The kind a manifest's recorded `source_kind` names; None for a name no kind has (a
    damaged record, or a version written by a newer release)."""
    return KINDS.get(name) if isinstance(name, str) else None


def list_sources(config: SourceConfig, context: ListContext) -> SourceListing:
    """Every input of `config`, sorted by `source`, each a file or a reject."""
    return kind_of(config).list(config, context)


def check_exists(config: SourceConfig) -> None:
    """SourceError naming source.path when it is not what its kind reads."""
    kind_of(config).check(config)


def check_columns(config: PipelineConfig) -> None:
    """ConfigError when `columns:` is set for a kind whose inputs carry nothing but an image."""
    kind = kind_of(config.source)
    if config.columns and not kind.columns:
        carrying = ", ".join(k.name for k in KINDS.values() if k.columns)
        raise ConfigError(
            f"columns: a {kind.name} source carries no per-sample values; the kinds that do "
            f"are {carrying}"
        )


def release_all() -> None:
    """Close whatever this process opened of any source (see `SourceKind.release`)."""
    for kind in KINDS.values():
        if kind.release is not None:
            kind.release()


@contextmanager
def released(spool: Path | None) -> Iterator[None]:
    """For the length of a run: afterwards, even after an error, delete the spool and close
    what this process opened of any source (so the caller may open it for writing)."""
    try:
        yield
    finally:
        if spool is not None:
            spool.unlink(missing_ok=True)
        release_all()
