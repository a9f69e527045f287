"""The inputs. Each source kind is one unit under `kinds/` (its lister, its worker's read, how
its inputs are found again), declared by a `SourceKind` (`kind`) and held by `registry`, the
only code that knows the kinds' names. What they share:

    entries      what a lister returns (`SourceFile`, `SourceReject`, `SourceListing`, columns)
    intake       building a listing; `RecordIntake` for records that exist only while listed
    labels       a record's label as a class name
    payloads     a record's image bytes, and the pickle guard
    containers   the rules of samples stored inside files (tars, tables)
    safe_files   reading a file without blocking on a FIFO or reading past max_file_bytes
    timed        reads with a time limit, read ahead of the caller
    spool        records handed to the workers through one file in the output folder
    readers      a worker's read of any input by its locator
    locate       finding a packed dataset's inputs again, for audit, repair and reject sheets
"""
