"""Shards to bytes in one process: the manifest version opened, its shards mapped and checked,
a batch's rows gathered with one numpy call. No torch sampler, no worker, no device here.

Modules:
- `batch_plan`:   how a batch of a selection is read: its shape, fill and columns
- `catalog`:      what to read: a manifest version opened, and selections of it
- `maps`:         the shards a process holds mapped: opened, checked, let go
- `page_cache`:   read-ahead and drop-behind advice to the kernel
- `flat_rows`:    samples of flat shards copied into a padded or back-to-back batch
- `reader`:       `ShardReader`: batches gathered, rows checked, reads advised
- `row_checks`:   which rows a loader checks, and where their checksums live
- `shard_checks`: a shard's checksum, its probe row, rows hashed as copied
- `span`:         every shard mapped in one array, so a batch is one numpy call
- `threads`:      a batch's per-sample work (decode, crop) spread over a pool of threads
- `timing`:       the stages of making a batch here (read, decode, crop), timed
"""
