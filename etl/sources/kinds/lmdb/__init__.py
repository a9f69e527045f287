"""The `lmdb` kind: an LMDB environment, one key per sample. Listed by `listing` (every value
read and hashed, memory-mapped), read back by key (`environment`); the keys entry and the
key,label file it may name are parsed by `keys_entry` and `key_labels`."""

from __future__ import annotations

from etl.config import LmdbSource
from etl.errors import SourceError
from etl.sources.kind import SourceKind
from etl.sources.kinds.lmdb.environment import close_lmdb, read_lmdb
from etl.sources.kinds.lmdb.listing import list_lmdb


def _check(config: LmdbSource) -> None:
    if not config.path.exists():
        raise SourceError(f"source.path: {config.path} is not an LMDB environment (no such file)")


KIND = SourceKind(
    name="lmdb",
    model=LmdbSource,
    list=list_lmdb,
    read=read_lmdb,
    check=_check,
    by_path=False,
    release=close_lmdb,
)
