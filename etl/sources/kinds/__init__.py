"""One module (or package) per source kind, each ending in its `KIND` (`etl.sources.kind`):
how it lists, how a worker reads one input, how an input is found again. The registry
(`etl.sources.registry`) holds them; nothing else knows their names.

Modules:
- `folder`:     one sub-folder per class
- `listing`:    a CSV or Parquet listing of paths and labels
- `lmdb/`:      an LMDB environment, one key per sample
- `parquet/`:   tables of encoded images (Parquet, Arrow IPC)
- `python`:     records a Python function returns
- `webdataset`: tar shards whose members are grouped by key
"""
