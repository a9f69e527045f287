from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest
import torch

from etl.format.checksums import digest
from etl.format.manifest import RECORDED_FILES
from etl.format.record import write_record
from loaders import PackedDataset
from loaders.read.catalog import open_catalog
from tests.helpers.packed import Packed, commit_subset, make_packed


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return make_packed(tmp_path / "ds")


def test_catalog_describes_the_manifest(packed: Packed) -> None:
    catalog = open_catalog(packed.root)
    assert catalog.version == 1
    assert catalog.classes == packed.classes
    assert catalog.sample_shape == packed.sample_shape and catalog.layout == "HWC"
    assert catalog.splits == ("train", "val")
    assert catalog.split_counts() == {
        "train": packed.splits.count("train"),
        "val": packed.splits.count("val"),
    }
    expected = np.bincount(packed.labels, minlength=3)
    assert list(catalog.class_counts().values()) == expected.tolist()
    val = [packed.labels[i] for i in packed.indices("val")]
    assert list(catalog.class_counts("val").values()) == np.bincount(val, minlength=3).tolist()
    assert catalog.table.column("sample_id").to_pylist() == packed.sample_ids


def test_a_manifest_in_many_record_batches_counts_and_selects_the_same(packed: Packed) -> None:
    """A manifest written in 4-row record batches with a third split: the mapped columns come
    in many chunks, and every count and selection still matches a plain Python count."""
    path = packed.root / "versions/v000001/manifest.arrow"
    table = ipc.open_file(path).read_all()
    splits = [s if i % 5 else "test" for i, s in enumerate(table.column("split").to_pylist())]
    table = table.set_column(table.schema.get_field_index("split"), "split", pa.array(splits))
    path.unlink()
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    write_record(path.parent, 1, RECORDED_FILES)
    catalog = open_catalog(packed.root)
    assert catalog.table.column("split").num_chunks > 1
    labels = table.column("label").to_pylist()
    assert catalog.splits == ("train", "val", "test")
    assert catalog.split_counts() == {s: splits.count(s) for s in ("train", "val", "test")}
    for split in ("train", "val", "test"):
        expected = [
            sum(1 for s, x in zip(splits, labels, strict=True) if s == split and x == c)
            for c in range(3)
        ]
        assert list(catalog.counts()[split].values()) == expected
        assert list(catalog.class_counts(split).values()) == expected
    selection = catalog.select(split=["test", "val"], classes=["bee", 2])
    wanted = [
        i
        for i, (s, x) in enumerate(zip(splits, labels, strict=True))
        if s != "train" and x in (1, 2)
    ]
    assert sorted(selection.positions.tolist()) == wanted
    assert selection.labels.tolist() == [labels[i] for i in selection.positions]
    pairs = list(zip(selection.shard_idx.tolist(), selection.rows.tolist(), strict=True))
    assert pairs == sorted(pairs)  # disk order


def test_every_sample_and_label_reads_back(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    assert len(ds) == len(packed.images)
    seen = set()
    for i in range(len(ds)):
        image, label = ds[i]
        p = int(ds.selection.positions[i])
        seen.add(p)
        on_disk = np.load(packed.shard_path(packed.shards[p]), mmap_mode="r")[packed.rows[p]]
        assert image.dtype == torch.uint8 and tuple(image.shape) == packed.sample_shape
        np.testing.assert_array_equal(image.numpy(), on_disk)
        np.testing.assert_array_equal(image.numpy(), packed.images[p])
        assert label == packed.labels[p]
    assert seen == set(range(len(packed.images)))


def test_indices_follow_shard_and_row(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    keys = [(packed.shards[p], packed.rows[p]) for p in ds.selection.positions.tolist()]
    assert keys == sorted(keys)


def test_batched_fetch_equals_single_fetch(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    indices = [5, 0, 29, 5, -1, 17, 3, 12]
    images, labels = ds.gather(indices)
    assert images.shape == (len(indices), *packed.sample_shape) and images.is_contiguous()
    assert labels.dtype == torch.int64
    for j, i in enumerate(indices):
        p = int(ds.selection.positions[i])
        np.testing.assert_array_equal(images[j].numpy(), packed.images[p])
        assert labels[j].item() == packed.labels[p]
    negative = np.array([-1, -2], dtype=np.int64)
    ds.gather(negative)
    assert negative.tolist() == [-1, -2], "the caller's index array is left alone"
    with pytest.raises(IndexError):
        ds.gather([len(ds)])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_sample_checksums_match_the_manifest(packed: Packed) -> None:
    catalog = open_catalog(packed.root)
    ds = PackedDataset(catalog.select())
    rows = catalog.table.take(ds.selection.positions)
    images, _ = ds.gather(list(range(len(ds))))
    for image, checksum in zip(images, rows.column("checksum").to_pylist(), strict=True):
        assert digest(image.numpy(), catalog.manifest.meta.checksum) == checksum


def test_filters_by_split_classes_and_predicates(packed: Packed) -> None:
    catalog = open_catalog(packed.root)

    def positions(**kwargs: object) -> set[int]:
        return set(catalog.select(**kwargs).positions.tolist())  # type: ignore[arg-type]

    assert positions(split="val") == set(packed.indices("val"))
    assert positions(split=["train", "val"]) == set(range(len(packed.images)))
    bees = {i for i, label in enumerate(packed.labels) if label == 1}
    assert positions(classes=["bee"]) == bees == positions(classes=[1])
    train_bees = bees & set(packed.indices("train"))
    assert positions(split="train", classes=["bee"]) == train_bees
    assert positions(where=pc.field("label") == 1) == bees
    assert positions(where=lambda t: pc.equal(t.column("label"), 1)) == bees
    assert positions(where=lambda t: np.arange(t.num_rows) < 4) == {0, 1, 2, 3}
    selection = catalog.select(split="train", classes=["cat", "ant"])
    cats_ants = {i for i in packed.indices("train") if packed.labels[i] in (0, 2)}
    assert set(selection.positions.tolist()) == cats_ants
    assert set(selection.labels.tolist()) <= {0, 2}


def test_bad_filters_say_what_is_valid(packed: Packed) -> None:
    catalog = open_catalog(packed.root)
    with pytest.raises(ValueError, match=r"splits are \['train', 'val'\]"):
        catalog.select(split="test")
    with pytest.raises(ValueError, match="classes are"):
        catalog.select(classes=["dog"])
    with pytest.raises(ValueError, match="classes are"):
        catalog.select(classes=[7])
    with pytest.raises(ValueError, match="one boolean per row"):
        catalog.select(where=lambda t: np.ones(3, dtype=bool))


def test_empty_selection_is_an_empty_dataset(packed: Packed) -> None:
    ds = PackedDataset(open_catalog(packed.root).select(where=pc.field("label") > 99))
    assert len(ds) == 0
    images, labels = ds.gather([])
    assert images.shape == (0, *packed.sample_shape) and labels.shape == (0,)


def test_pinned_version_and_manifest_file(packed: Packed) -> None:
    commit_subset(packed, keep=[0, 2, 4, 6], version=2)
    assert len(PackedDataset.open(packed.root)) == 4
    assert len(PackedDataset.open(packed.root, version=1)) == len(packed.images)
    manifest = packed.root / "versions" / "v000002" / "manifest.arrow"
    ds = PackedDataset.open(manifest)
    assert ds.selection.version == 2
    assert sorted(ds.selection.positions.tolist()) == [0, 1, 2, 3]
    image, _ = ds[1]
    np.testing.assert_array_equal(image.numpy(), packed.images[2])


def test_chw_layout(tmp_path: Path) -> None:
    packed = make_packed(tmp_path, sample_shape=(3, 4, 5), layout="CHW")
    ds = PackedDataset.open(tmp_path)
    assert ds.layout == "CHW" and ds.sample_shape == (3, 4, 5)
    images, _ = ds.gather([0, 1])
    np.testing.assert_array_equal(images.numpy(), packed.images[ds.selection.positions[:2]])


def test_transform_runs_per_sample_in_both_paths(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, transform=lambda x: x.float().mean(dim=-1))
    image, _ = ds[3]
    p = int(ds.selection.positions[3])
    np.testing.assert_allclose(image.numpy(), packed.images[p].astype(np.float32).mean(-1))
    images, _ = ds.gather([3, 4])
    assert images.shape == (2, *packed.sample_shape[:2]) and images.dtype == torch.float32
    np.testing.assert_allclose(images[0].numpy(), image.numpy())


def test_pickling_carries_no_open_shards(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    ds[0], ds[len(ds) - 1], ds.gather([1, len(ds) - 2])
    assert ds.reader.maps.arrays and ds.reader.maps.span is not None  # opened in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000
    twin = pickle.loads(blob)
    assert twin.reader.mapped() == set()
    np.testing.assert_array_equal(twin[4][0].numpy(), ds[4][0].numpy())
    assert twin.selection.shard_idx.dtype == np.int32 and twin.selection.rows.dtype == np.int32


def test_release_every_unmaps_and_still_reads_right(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, release_every=3 * int(np.prod(packed.sample_shape)))
    everything = list(range(len(ds)))
    images, _ = ds.gather(everything)
    assert ds.reader.mapped() == set(), "a batch of more than 3 samples released every mapping"
    np.testing.assert_array_equal(images.numpy(), packed.images[ds.selection.positions])
    ds[0], ds[1]
    assert len(ds.reader.mapped()) == 1
    ds[2]
    assert ds.reader.mapped() == set()
    with pytest.raises(ValueError, match="positive byte count"):
        PackedDataset.open(packed.root, release_every=0)
