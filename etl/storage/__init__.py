"""Object storage: a dataset in a store (`s3://`, `gs://`, any fsspec URL), reached through one
transport and mirrored into a verified local cache.

It imports `etl.format` for the rules of what lies on disk; nothing in `etl.format` imports it,
and fsspec is imported only when a store is reached. Every entry point asks `open_location`
where a dataset is; nothing else decides local or store.

Modules:
- `cache`:     the cache within a byte limit shared by a node's processes
- `cache_files`: the cache folder on disk: private unless shared, no symlink, locks, room
- `downloads`: downloads capped at the recorded bytes, bounded in time, tried again
- `fetch_ahead`: the bounded cache's thread that fetches an epoch's shards in its order
- `calls`:     calls to a store bounded in time and in the threads they leave behind
- `location`:  `open_location`: the one place that decides local folder or store
- `publish`:   a version uploaded, verified, then published by one conditional put
- `ranged`:    rows read with ranged GETs, each verified
- `records`:   what a commit record read from a store may make a reader fetch
- `retired`:   retired versions in a store, removed once their grace is over
- `store`:     a dataset in a store, mirrored into a verified local cache
- `transport`: the fsspec filesystem of a URL
"""
