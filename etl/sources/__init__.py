"""The inputs. Each source kind is one unit under `kinds/` (its lister, its worker's read, how
its inputs are found again), declared by a `SourceKind` (`kind`) and held by `registry`, the
only code that knows the kinds' names.

Modules:
- `containers`:     the rules of samples stored inside files (tars, tables)
- `entries`:        what a lister returns: files as Arrow columns, the listing
- `in_store`:       inputs in a store: listing a prefix, reading one object
- `intake`:         building a listing as a lister meets its inputs
- `kept`:           objects kept from the hash phase for the pack phase: one GET each
- `kind`:           `SourceKind`: what a source kind provides
- `kinds/`:         one unit per source kind
- `labels`:         a record's label as a class name
- `listed_rejects`: the inputs a lister refused, as Arrow rows
- `locate`:         finding a packed dataset's inputs again (audit, repair, reject sheets)
- `payloads`:       a record's image bytes, and the pickle guard
- `readers`:        a worker's read of any input by its locator
- `registry`:       every source kind by name: the only code that knows them
- `safe_files`:     reading a file without blocking or reading past max_file_bytes
- `spool`:          records handed to the workers through one file
- `timed`:          reads with a time limit, read ahead of the caller
"""
