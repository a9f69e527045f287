"""Object storage: a dataset in a store (`s3://`, `gs://`, any fsspec URL), reached through one
transport and mirrored into a verified local cache.

`store` (a dataset in a store and its mirror in the cache), `cache` (that cache within a byte
limit shared by a node's processes), `ranged` (rows read with ranged GETs, each verified),
`publish` (a version uploaded, verified, then published by one conditional put). It imports
`etl.format` for the rules of what lies on disk; nothing in `etl.format` imports it, and fsspec
is imported only when a store is reached.
"""
