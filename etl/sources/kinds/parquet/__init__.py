"""The `parquet` kind: tables of encoded images (Parquet files, Arrow IPC files or streams, the
layouts of image datasets on the Hugging Face Hub), one row a record, each spooled for the
workers (NOTE [spool] in etl/sources/spool.py).

Modules:
- `tables`: listing the rows of tables of encoded images
"""

from __future__ import annotations

from etl.config import ParquetSource
from etl.sources.containers import check_container_folder
from etl.sources.entries import ListContext, SourceListing
from etl.sources.kind import SourceKind
from etl.sources.spool import read_slice


def _list(config: ParquetSource, context: ListContext) -> SourceListing:
    # NOTE: imported here: `tables` imports pyarrow, which importing the registry (every kind)
    # need not pay for
    from etl.sources.kinds.parquet.tables import list_parquet

    return list_parquet(config, context)


KIND = SourceKind(
    name="parquet",
    list=_list,
    read=read_slice,
    check=check_container_folder,
    by_path=False,
    spooled=True,
    in_place=False,
    columns=True,
)
