"""The dataset folder's format: every rule about what lies on disk and how it is read back.

It imports nothing heavier than numpy and pyarrow (and simplejpeg, only where a JPEG sample is
decoded), so a training node reads a dataset without the ETL's dependencies; nothing here
imports `etl.storage` or fsspec. docs/FORMAT.md is its
prose twin.

Modules:
- `atomic`:         temp file then rename: a reader sees the old file or the whole new one
- `checksums`:      every digest algorithm by name
- `codecs`:         a stored sample's bytes to pixels and back: raw, JPEG, zlib
- `coherence`:      what a reader may rely on, checked when a version is opened
- `commit`:         the one way a version is published; leftovers of killed runs
- `contents`:       what a version holds (classes, shape, splits, counts) and its filters
- `lock`:           one writer per dataset folder
- `manifest`:       version folders and the manifest readers (lenient and strict)
- `mapped`:         Arrow files mapped read-only, whose pages a pass can let go of
- `names`:          how an input's raw name is spelt as `source`; sample ids
- `npy`:            the .npy header, parsed strictly
- `parts`:          a shard many tasks fill: rows at their slots, then sealed
- `predicate`:      `where=` as SQL: one checked boolean expression, run within limits
- `flat`:           where a sample of a flat shard (own size, or stored encoded) lives
- `record`:         commit.json: the size and BLAKE3 of a version's files
- `retirement`:     a retired version's record: unlisted, whole for a grace period
- `row_checksums`:  each sample's recorded checksum, found by (shard, row)
- `sample_columns`: per-sample columns: their types and the strict check of each value
- `schema`:         the manifest's Arrow schemas and `ManifestMeta`
- `shards`:         .npy shards: names, the writer, header checks, memory maps
- `sizes`:          byte sizes as people write them ('256MiB')
- `spill`:          a run's scratch folder; rows in sorted runs on disk, merged back
- `table_ops`:      lookups, codes, masks and sorted merges for million-row Arrow tables
- `values`:         a selection's per-sample column values, batched
- `views`:          a view: a named, pinned predicate over one version
"""
