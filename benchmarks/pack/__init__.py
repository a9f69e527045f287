"""Packing: `etl run`'s rate, memory and parent costs against the plain alternatives, over
sources, sizes, engines and decodes.

Modules:
- `contenders`:   what `throughput` times `etl run` against: the bare loop, the naive writer
- `draft`:        the reduced JPEG decode against the exact one
- `from_lmdb`:    an LMDB dataset moved to shards, then loaders against LMDB
- `from_store`:   packing photos in a bucket against packing them from local disk
- `grid`:         pack rate over dataset sizes x shard sizes x jobs, against a naive writer
- `incremental`:  a no-change rerun and a 1% addition against a full run
- `measures`:     `throughput`'s memory and fixed-cost runs, and its results
- `naive`:        the naive writer as a command of its own
- `on_dask`:      the Dask engine's overhead against loky
- `original`:     JPEG sources stored as their own bytes against encoding again
- `rejects`:      parent memory when every listed file is a reject
- `sources`:      the sources that hold images inside files, against a folder
- `throughput`:   pack rate and memory against a bare Pillow loop
- `throughput_table`: `throughput`'s README section
- `tree`:         what a run's parent costs per source file
- `worker_start`: what a pack worker pays before its first photo
"""
