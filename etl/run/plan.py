"""Pure planning: (sources, content hashes, previous manifest, config) -> pack, keep, reject.

No I/O happens here. Work is decided by content: a source whose path and stat match the previous
manifest keeps its stored pixels without being read; any source whose content hash equals
pixels already stored (a moved, renamed or touched file) reuses them without decoding; a source
whose hash matches a remembered reject is rejected again without decoding. Only the rest is
packed, into new shards: shards are immutable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import xxhash

from etl.config import PipelineConfig
from etl.format.manifest import SAMPLES_SCHEMA, Manifest
from etl.format.names import sample_id
from etl.format.shards import shard_name
from etl.images.rejects import CONTENT_REJECTS
from etl.run.tasks import PackItem, PackTask
from etl.sources.base import SourceFile, SourceListing, SourceReject

TRAIN = "train"


@dataclass(frozen=True)
class Plan:
    version: int
    classes: tuple[str, ...]
    tasks: tuple[PackTask, ...]
    reused: pa.Table
    """Manifest rows whose stored pixels are kept, with label, split and stat brought up to date
    (SAMPLES_SCHEMA, sorted by source)."""
    rejects: tuple[SourceReject, ...]
    counts: Mapping[str, int] = field(default_factory=dict)
    """unchanged, changed, new, moved, deleted, rejected: what the plan found."""

    @property
    def to_pack(self) -> int:
        return sum(len(t.items) for t in self.tasks)


def pack_order(source: str) -> int:
    """Position key of a source within the shards a run writes: a seeded hash of its path."""
    return xxhash.xxh3_64_intdigest(b"order:" + source.encode("utf-8"))


def assign_split(source: str, fractions: Mapping[str, float]) -> str:
    """Deterministic split by a hash of the path: a sample keeps its split as other files come
    and go. Fractions are taken in sorted split-name order; the remainder is 'train'."""
    u = xxhash.xxh3_64_intdigest(b"split:" + source.encode("utf-8")) / 2.0**64
    edge = 0.0
    for name in sorted(fractions):
        edge += fractions[name]
        if u < edge:
            return name
    return TRAIN


StatKey = tuple[int, int, int, int]


def stat_key(size: int, mtime_ns: int, ctime_ns: int, inode: int) -> StatKey:
    """What must all match the previous manifest for a file to count as unchanged unread.

    NOTE: size and mtime alone miss a file rewritten in place with its old mtime put back
    (`touch -r`, `cp -p`, rsync, some editors); ctime cannot be set back from user space and
    a replaced file has a new inode, as git's index compares too. A chmod, a rename or a copy
    elsewhere changes them as well: that costs a re-hash, never a re-pack (same content).
    """
    return (size, mtime_ns, ctime_ns, inode)


def _key_of(f: SourceFile) -> StatKey:
    return stat_key(f.size, f.mtime_ns, f.ctime_ns, f.inode)


def _reused_rows(
    previous: Manifest | None,
    rows: list[int],
    new_identity: list[tuple[SourceFile, int, str]],
    classes: tuple[str, ...],
) -> pa.Table:
    """Previous rows `rows` (their pixels and checksums) under their current identity.

    NOTE: built column-wise with Arrow, not as Python dicts: on a no-change rerun every sample
    passes through here, and dicts cost seconds per 100k samples.
    """
    if previous is None or not rows:
        return SAMPLES_SCHEMA.empty_table()
    table = previous.samples.take(pa.array(rows, pa.int64()))
    updates = {
        "sample_id": pa.array([sample_id(f.source) for f, _, _ in new_identity], pa.string()),
        "source": pa.array([f.source for f, _, _ in new_identity], pa.string()),
        "source_size": pa.array([f.size for f, _, _ in new_identity], pa.int64()),
        "source_mtime_ns": pa.array([f.mtime_ns for f, _, _ in new_identity], pa.int64()),
        "source_ctime_ns": pa.array([f.ctime_ns for f, _, _ in new_identity], pa.int64()),
        "source_inode": pa.array([f.inode for f, _, _ in new_identity], pa.uint64()),
        "label": pa.array([label for _, label, _ in new_identity], pa.int32()),
        "class_name": pa.array([classes[label] for _, label, _ in new_identity], pa.string()),
        "split": pa.array([split for _, _, split in new_identity], pa.string()),
    }
    for name, column in updates.items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table.cast(SAMPLES_SCHEMA).sort_by("source")


def files_to_hash(listing: SourceListing, previous: Manifest | None) -> list[SourceFile]:
    """Sources whose content hash is known neither from listing (`content_hash`) nor from the
    previous manifest by path and stat."""
    known = _known_by_stat(previous)
    return [
        f for f in listing.files if f.content_hash is None and (f.source, _key_of(f)) not in known
    ]


def settled_hashes(previous: Manifest | None) -> frozenset[str]:
    """Contents `make_plan` never packs: pixels already stored, or a remembered content reject.
    A lister that must copy what is to be packed (a Python source's spool) skips these."""
    if previous is None:
        return frozenset()
    stored = set(previous.samples.column("source_hash").to_pylist())
    rejects = previous.rejects.select(["reason", "source_hash"]).to_pylist()
    stored.update(
        r["source_hash"] for r in rejects if r["reason"] in CONTENT_REJECTS and r["source_hash"]
    )
    return frozenset(stored)


_STAT_COLUMNS = ["source_size", "source_mtime_ns", "source_ctime_ns", "source_inode"]


def _known_by_stat(previous: Manifest | None) -> dict[tuple[str, StatKey], str]:
    """{(source, stat key): content hash} of the previous version's rows with a whole stat key
    (rows written before ctime and inode were recorded have none: hashed once again)."""
    if previous is None:
        return {}
    known: dict[tuple[str, StatKey], str] = {}
    for table in (previous.samples, previous.rejects):
        cols = table.select(["source", "source_hash", *_STAT_COLUMNS]).to_pydict()
        for source, digest, *key in zip(*cols.values(), strict=True):
            if digest is not None and None not in key:
                known[(source, stat_key(*key))] = digest
    return known


def _reject(f: SourceFile, reason: str, message: str, digest: str) -> SourceReject:
    return SourceReject(f.source, reason, message, f.size, f.mtime_ns, digest, f.ctime_ns, f.inode)


def resolve_classes(
    config: PipelineConfig,
    names: Iterable[str],
    prior: tuple[str, ...],
    declared: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """Label order: a fixed `classes:` list, else the prior version's classes followed by the
    new names, in the order the source declares them (`SourceListing.classes`) and then sorted,
    so adding a class never renumbers existing ones."""
    if config.source.classes is not None:
        return tuple(config.source.classes)
    known = set(prior)
    ordered = [name for name in declared or () if name not in known]
    known.update(ordered)
    return (*prior, *ordered, *sorted(set(names) - known))


def make_plan(
    config: PipelineConfig,
    listing: SourceListing,
    hashes: Mapping[str, str],
    hash_rejects: Iterable[SourceReject],
    previous: Manifest | None,
    version: int,
    prior_classes: tuple[str, ...] = (),
) -> Plan:
    """Decide every source's fate. `hashes` holds the content hash of each file returned by
    `files_to_hash` that could be read (a file with a `content_hash` from listing needs none);
    `hash_rejects` the ones that could not. `previous` is the manifest whose pixels may be
    reused (None for a first run or a rebuild); `prior_classes` the label order to extend."""
    known = _known_by_stat(previous)
    rejects: list[SourceReject] = list(listing.rejects) + list(hash_rejects)
    failed = {r.source for r in rejects}

    present_classes = {f.class_name for f in listing.files if f.class_name is not None}
    classes = resolve_classes(config, present_classes, prior_classes, listing.classes)
    label_of = {name: i for i, name in enumerate(classes)}

    # 1. content hash and label of every readable source
    candidates: list[tuple[SourceFile, str]] = []
    for f in listing.files:
        if f.source in failed:
            continue
        # NOTE: a hash from listing wins over the stat: those kinds have no stat that proves
        # a value unchanged (an LMDB value rewritten with the same length keeps size and mtime 0)
        digest = f.content_hash or known.get((f.source, _key_of(f))) or hashes.get(f.source)
        if digest is None:
            raise ValueError(f"no content hash for {f.source}: files_to_hash was not honoured")
        if f.class_name not in label_of:
            message = f"class {f.class_name!r} is not in source.classes"
            rejects.append(_reject(f, "unknown_label", message, digest))
            continue
        candidates.append((f, digest))

    # 2. exact duplicates by content
    policy = config.validate_stage.duplicates
    if policy != "allow":
        by_hash: dict[str, list[str]] = defaultdict(list)
        for f, digest in candidates:
            by_hash[digest].append(f.source)
        losers: dict[str, str] = {}
        for sources in by_hash.values():
            if len(sources) > 1:
                first = min(sources)
                for s in sources:
                    if s != first or policy == "reject_all":
                        others = [o for o in sources if o != s]
                        losers[s] = f"same bytes as {', '.join(sorted(others)[:3])}"
        kept: list[tuple[SourceFile, str]] = []
        for f, digest in candidates:
            if f.source in losers:
                rejects.append(_reject(f, "duplicate", losers[f.source], digest))
            else:
                kept.append((f, digest))
        candidates = kept

    # 3. reuse stored pixels, repeat remembered rejects, or pack
    stored: dict[str, int] = {}
    old_by_source: dict[str, str] = {}
    remembered: dict[str, tuple[str, str]] = {}
    if previous is not None:
        old_hashes = previous.samples.column("source_hash").to_pylist()
        for index, digest in enumerate(old_hashes):
            stored.setdefault(digest, index)
        old_by_source = dict(
            zip(previous.samples.column("source").to_pylist(), old_hashes, strict=True)
        )
        for row in previous.rejects.to_pylist():
            if row["reason"] in CONTENT_REJECTS and row["source_hash"]:
                remembered[row["source_hash"]] = (row["reason"], row["message"])

    counts: Counter[str] = Counter()
    reuse_from: list[int] = []
    reuse_as: list[tuple[SourceFile, int, str]] = []
    to_pack: list[PackItem] = []
    for f, digest in candidates:
        assert f.class_name is not None
        split = f.split or assign_split(f.source, config.source.split)
        label = label_of[f.class_name]
        if f.source in old_by_source:
            counts["unchanged" if old_by_source[f.source] == digest else "changed"] += 1
        if digest in stored:
            reuse_from.append(stored[digest])
            reuse_as.append((f, label, split))
            if f.source not in old_by_source:
                counts["moved"] += 1
        elif digest in remembered:
            reason, message = remembered[digest]
            rejects.append(_reject(f, reason, message, digest))
        else:
            if f.source not in old_by_source:
                counts["new"] += 1
            to_pack.append(
                PackItem(
                    source=f.source,
                    path=f.path,
                    source_hash=digest,
                    size=f.size,
                    mtime_ns=f.mtime_ns,
                    ctime_ns=f.ctime_ns,
                    inode=f.inode,
                    sample_id=sample_id(f.source),
                    label=label,
                    class_name=f.class_name,
                    split=split,
                )
            )
    reused = _reused_rows(previous, reuse_from, reuse_as, classes)
    counts["deleted"] = len(set(old_by_source) - {f.source for f in listing.files})
    counts["rejected"] = len(rejects)

    # NOTE: shards are filled in a hash order of the source path, not in path order: path order
    # puts one class in a shard, which makes every locality-friendly read order (block shuffle,
    # streaming whole shards) see one class at a time. The order is still a pure function of
    # the paths, so loky, Dask and a rerun produce the same shards.
    to_pack.sort(key=lambda item: pack_order(item.source))
    per_shard = config.samples_per_shard
    tasks = tuple(
        PackTask(
            shard=shard_name(version, i // per_shard),
            items=tuple(to_pack[i : i + per_shard]),
        )
        for i in range(0, len(to_pack), per_shard)
    )
    return Plan(
        version=version,
        classes=classes,
        tasks=tasks,
        reused=reused,
        rejects=tuple(sorted(rejects, key=lambda r: r.source)),
        counts=dict(counts),
    )
