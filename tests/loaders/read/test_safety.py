"""Opening refuses what it cannot trust: tampered manifests, escaping paths, bad shards."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import etl.format.row_checksums as row_checksums
import loaders.read.shard_checks
from etl.errors import ManifestError, ShardError
from loaders import PackedDataset, PackedStream, make_loader, stream_loader
from loaders.read.catalog import open_catalog
from tests.helpers.packed import Packed, make_packed
from tests.helpers.packed import rewrite_sealed as rewrite

MANIFEST = Path("versions/v000001/manifest.arrow")
SHARDS = Path("versions/v000001/shards.arrow")


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return make_packed(tmp_path / "ds")


def replace_column(path: Path, name: str, values: list[object]) -> None:
    table = ipc.open_file(path).read_all()
    column = pa.array(values, table.schema.field(name).type)
    rewrite(path, table.set_column(table.schema.get_field_index(name), name, column))


def test_unknown_format_version_is_refused(packed: Packed) -> None:
    path = packed.root / MANIFEST
    table = ipc.open_file(path).read_all()
    metadata = {**table.schema.metadata, b"etl.format_version": b"2"}
    rewrite(path, table.replace_schema_metadata(metadata))
    with pytest.raises(ManifestError, match="format version 2"):
        PackedDataset.open(packed.root)


@pytest.mark.parametrize(
    "bad", ["/etc/passwd.npy", "shards/../../outside.npy", "../shards/x.npy", "shards/x.bin"]
)
def test_shard_paths_must_stay_inside_the_dataset(packed: Packed, bad: str) -> None:
    table = ipc.open_file(packed.root / SHARDS).read_all()
    names = table.column("shard").to_pylist()
    replace_column(packed.root / SHARDS, "shard", [bad, *names[1:]])
    samples = ipc.open_file(packed.root / MANIFEST).read_all()
    fixed = [bad if s == names[0] else s for s in samples.column("shard").to_pylist()]
    replace_column(packed.root / MANIFEST, "shard", fixed)
    with pytest.raises(ManifestError, match="not of the form"):
        PackedDataset.open(packed.root)
    with pytest.raises(ManifestError, match="not of the form"):
        open_catalog(packed.root / MANIFEST)


def test_a_row_past_the_end_of_its_shard_is_refused(packed: Packed) -> None:
    samples = ipc.open_file(packed.root / MANIFEST).read_all()
    rows = samples.column("row").to_pylist()
    replace_column(packed.root / MANIFEST, "row", [99, *rows[1:]])
    with pytest.raises(ManifestError, match="outside shard"):
        PackedDataset.open(packed.root)


def truncate(path: Path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - nbytes)


def test_truncated_shard_raises_shard_error_naming_it(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    victim = packed.root / ds.selection.shards.names[1]
    truncate(victim, 7)
    first = int(np.flatnonzero(ds.selection.shard_idx == 1)[0])
    ds[0]  # other shards still read
    with pytest.raises(ShardError, match=rf"{victim}.*bytes on disk"):
        ds[first]
    with pytest.raises(ShardError, match=str(victim)):
        ds.gather(list(range(len(ds))))


def test_shard_with_a_different_shape_is_refused(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    victim = packed.root / ds.selection.shards.names[0]
    np.save(victim, np.zeros((7, 5, 6, 3), dtype=np.uint8))  # same byte count, other shape
    with pytest.raises(ShardError, match="shape"):
        ds[0]


def test_missing_shard_is_a_shard_error_in_workers_too(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    (packed.root / ds.selection.shards.names[2]).unlink()
    loader = make_loader(ds, batch_size=4, num_workers=1, workers_as="processes", pin_memory=False)
    with pytest.raises(ShardError, match="missing"):
        list(loader)


def test_workers_stop_as_soon_as_an_error_ends_their_epoch(tmp_path: Path) -> None:
    """Not when the iterator is garbage collected, later, in whatever the process runs next
    (after a joblib pool it waited 10 s there): the raise leaves no worker behind, while the
    exception and its traceback, which refer to the iterator, are still held."""
    packed = make_packed(tmp_path / "ds")
    ds = PackedDataset.open(packed.root)
    (packed.root / ds.selection.shards.names[2]).unlink()
    before = set(psutil.Process().children())
    loader = make_loader(ds, batch_size=2, num_workers=2, workers_as="processes", pin_memory=False)
    with pytest.raises(ShardError) as raised:
        list(loader)
    assert raised.value.__traceback__ is not None
    left = set(psutil.Process().children()) - before
    assert not left, [(child.pid, describe(child)) for child in left]


def describe(process: psutil.Process) -> str:
    """A leftover child's status and command line, or that it has gone since."""
    try:
        return f"{process.status()} {' '.join(process.cmdline())[:200]}"
    except psutil.Error as exc:
        return type(exc).__name__


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_swapped_with_another_of_its_shape_is_refused_not_read(
    tmp_path: Path, workers: int
) -> None:
    """Same header, same size: only the samples differ. Without verify="shards" too, the reader
    checks one row of each shard it opens against the manifest's checksum of that sample."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(5, 5, 5), orphans=0)
    first, second = (packed.root / name for name in sorted(set(packed.shards))[:2])
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    ds = PackedDataset.open(packed.root)
    loader = make_loader(
        ds, batch_size=4, num_workers=workers, workers_as="processes", pin_memory=False
    )
    with pytest.raises(ShardError, match=r"is not the sample the manifest stores there"):
        list(loader)
    with pytest.raises(ShardError, match=r"replaced or changed"):
        ds[0]


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))


def test_verify_catches_changed_bytes_of_the_shards_opened(packed: Packed) -> None:
    names = open_catalog(packed.root).select().shards.names
    flip_a_byte(packed.root / names[-1])
    ds = PackedDataset.open(packed.root, verify="shards")
    ds[0]  # an intact shard
    last = len(ds) - 1
    with pytest.raises(ShardError, match="does not match the manifest"):
        ds[last]
    unverified = PackedDataset.open(packed.root)
    assert unverified[last][0].shape == packed.sample_shape  # same size: only verify can tell
    stream = PackedStream(open_catalog(packed.root).select(), verify="shards", shuffle=False)
    with pytest.raises(ShardError, match="does not match the manifest"):
        list(stream)


def change_a_pixel_of_sample_1(packed: Packed) -> None:
    """One byte of the pixels of sample 1 (shard 0, row 1), flipped in place."""
    path = packed.root / packed.shards[0]
    data = bytearray(path.read_bytes())
    row_bytes = packed.images[0].nbytes
    header = len(data) - np.load(path, mmap_mode="r").shape[0] * row_bytes
    data[header + row_bytes + 3] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("workers", [0, 2])
def test_verify_rows_names_a_changed_pixel_as_its_row_is_read(packed: Packed, workers: int) -> None:
    """One pixel byte of sample 1 (shard 0, row 1) changed: `verify=False` reads it (only
    the probe row and the file's size are checked); `verify="rows"` and the default open
    (`"once"`) read every other sample with its packed pixels and stop at that row with an
    error naming the shard, the row and the repair, in the map-style loader, its workers and
    the stream."""
    change_a_pixel_of_sample_1(packed)
    unchecked = PackedDataset.open(packed.root, verify=False)
    assert unchecked[1][0].numpy().tobytes() != packed.images[1].tobytes()
    ds = PackedDataset.open(packed.root, verify="rows")
    positions = ds.selection.positions
    for i in (0, 2, len(ds) - 1):
        assert ds[i][0].numpy().tobytes() == packed.images[positions[i]].tobytes()
    pattern = r"v000001-00000\.npy: row 1 does not match the checksum.*repair: etl audit"
    with pytest.raises(ShardError, match=pattern):
        ds[int(np.flatnonzero(positions == 1)[0])]
    with pytest.raises(ShardError, match=pattern):
        PackedDataset.open(packed.root)[int(np.flatnonzero(positions == 1)[0])]
    with pytest.raises(ShardError, match=pattern):
        list(
            make_loader(ds, batch_size=4, shuffle=True, num_workers=workers, workers_as="processes")
        )
    with pytest.raises(ShardError, match=pattern):
        list(PackedStream(ds.selection, batch_size=4))
    plain = open_catalog(packed.root).select()  # no checks of its own: the stream makes them
    with pytest.raises(ShardError, match=pattern):
        list(stream_loader(PackedStream(plain, batch_size=4), num_workers=workers))
    streamed = list(PackedStream(plain, batch_size=64, shuffle=False, verify=False))
    assert sum(len(batch.labels) for batch in streamed) == len(ds)  # unchecked: read as it is
    with pytest.raises(ValueError, match="verify must be True, False, 'rows' or 'once'"):
        PackedDataset.open(packed.root, verify="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [0, 2])
def test_verify_once_checks_each_row_the_first_time_any_process_reads_it(
    packed: Packed, workers: int
) -> None:
    """`verify="once"`: a clean epoch checks every row once, in whichever process read it
    (the flags are shared with the workers), and the next epoch hashes nothing; a changed
    pixel byte in a row not read yet is an error naming the shard and the row."""
    ds = PackedDataset.open(packed.root, verify="once")
    loader = make_loader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        workers_as="processes",
        pin_memory=False,
    )
    for images, _ in loader:
        assert images.shape[1:] == packed.sample_shape
    seen = ds.selection.shards.seen()
    assert seen is not None and seen.all()  # set by whichever process read each row

    calls = []
    real = row_checksums.RowChecksums.unchecked

    def counting(self: row_checksums.RowChecksums, *args: Any) -> Any:
        calls.append(1)
        return real(self, *args)

    hashed = []
    real_digest = row_checksums.raw_digest

    def counting_digest(algorithm: str) -> object:
        one = real_digest(algorithm)
        return lambda data: (hashed.append(1), one(data))[1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(row_checksums, "raw_digest", counting_digest)
        mp.setattr(row_checksums.RowChecksums, "unchecked", counting)
        for _ in make_loader(ds, batch_size=4, shuffle=True, pin_memory=False):
            pass
    assert calls and not hashed  # checked, and nothing hashed again

    change_a_pixel_of_sample_1(packed)
    fresh = PackedDataset.open(packed.root, verify="once")
    pattern = r"v000001-00000\.npy: row 1 does not match the checksum.*repair: etl audit"
    loader = make_loader(
        fresh,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        workers_as="processes",
        pin_memory=False,
    )
    with pytest.raises(ShardError, match=pattern):
        list(loader)


@pytest.mark.parametrize("verify", ["rows", "once"])
def test_rows_checked_a_few_at_a_time_name_the_changed_one(
    packed: Packed, verify: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are hashed right after their copy, a few at a time (here one: `CHECK_BYTES` below
    a row): a batch of every sample reads the intact ones as packed and names row 1 of shard 0,
    whichever position of the batch it has."""
    monkeypatch.setattr(loaders.read.shard_checks, "CHECK_BYTES", 1)
    ds = PackedDataset.open(packed.root, verify=verify)  # type: ignore[arg-type]
    order = np.random.default_rng(5).permutation(len(ds))
    images = ds.__getitems__(order.tolist()).batch.images.numpy()
    for image, i in zip(images, order.tolist(), strict=True):
        assert image.tobytes() == packed.images[ds.selection.positions[i]].tobytes()
    change_a_pixel_of_sample_1(packed)
    fresh = PackedDataset.open(packed.root, verify=verify)  # type: ignore[arg-type]
    pattern = r"v000001-00000\.npy: row 1 does not match the checksum"
    with pytest.raises(ShardError, match=pattern):
        fresh.__getitems__(order.tolist())


@pytest.mark.parametrize("algorithm", ["xxh3_64", "xxh3_128", "blake3", "sha256"])
def test_row_checksums_kept_as_bytes_match_the_hex_the_manifest_records(algorithm: str) -> None:
    """The manifest's hex values become raw digests in one vectorised pass: each row matches
    its own (hashed here by the library itself), not another's; a value that is not a digest
    (null, short, not hex, upper case) matches nothing, and the others still match."""
    import hashlib

    import blake3
    import xxhash

    hashers = {
        "xxh3_64": lambda b: xxhash.xxh3_64(b).hexdigest(),
        "xxh3_128": lambda b: xxhash.xxh3_128(b).hexdigest(),
        "blake3": lambda b: blake3.blake3(b).hexdigest(),
        "sha256": lambda b: hashlib.sha256(b).hexdigest(),
    }
    rows = np.random.default_rng(1).integers(0, 256, (9, 48), dtype=np.uint8)
    hexes: list[str | None] = [hashers[algorithm](r.tobytes()) for r in rows]
    good = hexes[5]
    assert good is not None
    hexes[5], hexes[6], hexes[7], hexes[8] = None, good[:-1], "g" + good[1:], good.upper()
    column = pa.chunked_array([pa.array(hexes[:4]), pa.array(hexes[4:])])
    sums = row_checksums.RowChecksums.from_hex(np.arange(9, dtype=np.int64), column, algorithm)
    assert [sums.matches(i, rows[i]) for i in range(9)] == [True] * 5 + [False] * 4
    assert not any(sums.matches(i, rows[(i + 1) % 5]) for i in range(5))
    shard = np.zeros(5, dtype=np.int64)
    assert sums.first_mismatch(shard, np.arange(5), rows[:5]) is None
    assert sums.first_mismatch(shard[:3], np.array([0, 1, 6]), rows[[0, 1, 6]]) == 2


def test_verify_hashes_each_shard_once_per_process(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = loaders.read.shard_checks.file_digests

    def counting(path: Path, algorithms: tuple[str, ...]) -> tuple[str, ...]:
        calls.append(Path(path))
        return real(path, algorithms)

    monkeypatch.setattr(loaders.read.shard_checks, "file_digests", counting)
    ds = PackedDataset.open(packed.root, verify="shards")
    ds.gather(list(range(len(ds))))
    again = PackedDataset.open(packed.root, verify="shards")
    again.gather(list(range(len(ds))))
    assert sorted(calls) == sorted({packed.root / n for n in ds.selection.shards.names})


# --- what the loader trusts on open (issue: faults a user will cause) -----------------------------


def flip_at(path: Path, where: str) -> None:
    size = path.stat().st_size
    offset = {"head": 3, "middle": size // 2, "tail": size - 3}[where]
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0x20]))


@pytest.mark.parametrize("where", ["head", "middle", "tail"])
@pytest.mark.parametrize("name", ["manifest.arrow", "shards.arrow", "rejects.arrow", "commit.json"])
def test_a_byte_flipped_in_any_committed_file_is_refused_on_open(
    packed: Packed, name: str, where: str
) -> None:
    flip_at(packed.root / "versions/v000001" / name, where)
    with pytest.raises(ManifestError) as info:
        PackedDataset.open(packed.root)
    message = str(info.value)
    assert f"versions/v000001/{name}: " in message and "\n" not in message
    assert "etl audit" in message and "verify_manifest=False" in message


def test_verify_manifest_false_opens_a_version_whose_record_is_damaged(packed: Packed) -> None:
    flip_at(packed.root / "versions/v000001/commit.json", "middle")
    with pytest.raises(ManifestError, match=r"commit\.json"):
        open_catalog(packed.root)
    ds = PackedDataset.open(packed.root, verify_manifest=False)
    images = np.stack([ds[i][0].numpy() for i in range(len(ds))])
    order = ds.selection.positions
    assert np.array_equal(images, packed.images[order])


def set_column(path: Path, name: str, column: pa.Array) -> None:
    table = ipc.open_file(path).read_all()
    rewrite(path, table.set_column(table.schema.get_field_index(name), name, column))


def test_tampered_values_are_refused_naming_the_column_and_first_row(packed: Packed) -> None:
    """Rewritten and resealed, so the record cannot tell: the checks on open must."""
    path = packed.root / MANIFEST
    original = ipc.open_file(path).read_all()
    n = original.num_rows
    sources = original.column("source").to_pylist()

    def refused(name: str, values: pa.Array) -> str:
        set_column(path, name, values)
        with pytest.raises(ManifestError) as info:
            PackedDataset.open(packed.root)
        rewrite(path, original)
        message = str(info.value)
        assert "\n" not in message and str(path) in message
        return message

    labels = original.column("label").to_pylist()
    assert refused("label", pa.array([*labels[:5], 3, *labels[6:]], pa.int32())).endswith(
        f"column 'label' is outside the 3 classes at row 5 (source {sources[5]!r})"
    )
    assert "column 'label' is string, the format says int32" in refused(
        "label", pa.array(["ant"] * n)
    )
    assert "column 'checksum' is empty (null) at row 2" in refused(
        "checksum", pa.array([*original.column("checksum").to_pylist()[:2], *[None] * (n - 2)])
    )
    set_column(path, "checksum", pa.array([""] * n))  # a value no loader reads: the audit's
    assert len(PackedDataset.open(packed.root)) == n  # (test_audit: values the loaders skip)
    rewrite(path, original)
    rows = original.column("row").to_pylist()
    assert "column 'row' (99) is outside shard 'shards/v000001-00000.npy', which has 7 rows" in (
        refused("row", pa.array([*rows[:1], 99, *rows[2:]], pa.int64()))
    )
    rewrite(path, original.drop_columns(["split"]))
    with pytest.raises(ManifestError, match=r"missing columns \['split'\]"):
        PackedDataset.open(packed.root)
    rewrite(path, original)
    assert len(PackedDataset.open(packed.root)) == len(packed.images)


def test_an_emptied_shard_checksum_is_refused(packed: Packed) -> None:
    table = ipc.open_file(packed.root / SHARDS).read_all()
    set_column(packed.root / SHARDS, "checksum", pa.array([""] * table.num_rows))
    with pytest.raises(
        ManifestError,
        match=re.escape("shards.arrow column 'checksum' of 'shards/v000001-00000.npy' is not a"),
    ):
        PackedDataset.open(packed.root)


# --- a shard that turns unreadable during training ------------------------------------------------


def _ids_in_shard(packed: Packed, shard: str) -> list[str]:
    return [i for i, s in zip(packed.sample_ids, packed.shards, strict=True) if s == shard]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("damage", ["truncated", "folder", "flipped"])
def test_an_unreadable_shard_mid_training_is_one_error_naming_samples_and_repair(
    packed: Packed, workers: int, damage: str
) -> None:
    ds = PackedDataset.open(packed.root, verify="shards" if damage == "flipped" else False)
    name = ds.selection.shards.names[2]
    path = packed.root / name
    if damage == "truncated":
        truncate(path, 7)
    elif damage == "folder":  # an I/O error of another kind: open() itself fails
        path.unlink()
        path.mkdir()
    else:
        flip_a_byte(path)
    loader = make_loader(
        ds, batch_size=4, num_workers=workers, workers_as="processes", pin_memory=False
    )
    with pytest.raises(ShardError) as info:
        list(loader)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    ids = _ids_in_shard(packed, name)
    assert str(path) in message and f"it holds {len(ids)} sample(s) of version 1" in message
    assert all(i in message for i in ids[:3])
    assert message.endswith(
        f"repair: etl audit {packed.root} --version 1 --repair --config pipeline.yaml"
    )


def test_verify_true_is_verify_shards_and_warns_once(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`verify=True`, the former name of "shards": the same reader (each shard hashed whole
    once per process, no row checks), one DeprecationWarning, the first time only."""
    import etl.deprecations

    monkeypatch.setattr(etl.deprecations, "_WARNED", set())
    with pytest.warns(DeprecationWarning, match=r'verify=True is deprecated: use verify="shards"'):
        old = PackedDataset.open(packed.root, verify=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PackedDataset.open(packed.root, verify=True)  # no second warning
        new = PackedDataset.open(packed.root, verify="shards")
    assert old.reader.maps.verify_shards and new.reader.maps.verify_shards
    assert old.selection.shards.row_sums is None and new.selection.shards.row_sums is None
