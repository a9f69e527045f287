"""The plan of a whole listing held in memory: the oracle `etl.run.staged.staged_plan` is checked
against (tests/run/test_staged.py), and the planner the decision tests call directly. It is made of
the same pure functions as the real planner (`etl.run.plan`), a window and a bucket at once."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from etl.config import PipelineConfig
from etl.format.manifest import Manifest
from etl.format.table_ops import sorted_by, value_codes
from etl.run.decide import assemble, check_window, decide
from etl.run.plan import (
    Hashes,
    Plan,
    hash_column,
    known_digests,
    remembered_rejects,
    resolve_classes,
    same_source,
)
from etl.sources.entries import SourceListing
from etl.sources.listed_rejects import SourceReject, rejects_table


def make_plan(
    config: PipelineConfig,
    listing: SourceListing,
    hashes: Hashes,
    hash_rejects: Iterable[SourceReject],
    previous: Manifest | None,
    version: int,
    prior_classes: tuple[str, ...] = (),
) -> Plan:
    """Decide every source's fate, with the whole listing in memory (`etl.run.staged` makes
    the same plan a window and a bucket at a time). `hashes` holds the content hash of each
    file `needs_hash` picks that could be read (a file with a `content_hash` from listing needs
    none); `hash_rejects` the ones that could not. `previous` is the manifest whose pixels may
    be reused (None for a first run or a rebuild); `prior_classes` the label order to extend."""
    files = listing.files.table
    rejects: list[SourceReject] = list(listing.rejects) + list(hash_rejects)
    failed = pa.array(sorted({r.source for r in rejects}), pa.string())
    samples = previous.samples if previous is not None else None
    known = known_digests(files, samples, previous.rejects if previous is not None else None)
    # NOTE: a hash from listing wins over the stat: those kinds have no stat that proves a
    # value unchanged (an LMDB value rewritten with the same length keeps size and mtime 0)
    digests = pc.coalesce(files.column("content_hash"), known, hash_column(hashes, files))
    old_ids, old_hashes = same_source(files, samples)
    checked = check_window(files, digests, failed, old_ids, old_hashes)
    names = value_codes(files.column("class_name"))[0]
    classes = resolve_classes(config, names, prior_classes, listing.classes)
    before = sorted_by(rejects_table(rejects), "source")
    if previous is None:
        return assemble(config, version, classes, decide(config, checked, classes), before)
    decided = decide(config, checked, classes, previous.samples, remembered_rejects(previous))
    decided.counts["deleted"] = previous.samples.num_rows - (len(old_ids) - old_ids.null_count)
    return assemble(config, version, classes, decided, before)
