"""The `lmdb` kind: an LMDB environment, one key per sample.

Modules:
- `environment`: environments opened once per process; one key read back
- `key_labels`:  the labels file (key, label, split) as a compact lookup
- `keys_entry`:  the entry that lists the keys to pack, read a key at a time
- `listing`:     listing an environment: one sample per key, every value hashed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etl.errors import SourceError
from etl.sources.kind import SourceKind
from etl.sources.kinds.lmdb.environment import close_lmdb, read_lmdb

if TYPE_CHECKING:
    from etl.config import LmdbSource
    from etl.sources.entries import ListContext, SourceListing


def _list(config: LmdbSource, context: ListContext) -> SourceListing:
    # NOTE: imported here: listing reads the labels' tables (pyarrow), and a worker that reads
    # keys (`read_lmdb`) imports this package
    from etl.sources.kinds.lmdb.listing import list_lmdb

    return list_lmdb(config, context)


def _check(config: LmdbSource) -> None:
    if not config.path.exists():
        raise SourceError(f"source.path: {config.path} is not an LMDB environment (no such file)")


KIND = SourceKind(
    name="lmdb",
    list=_list,
    read=read_lmdb,
    check=_check,
    by_path=False,
    release=close_lmdb,
)
