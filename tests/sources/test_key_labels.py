"""KeyLabels (an LMDB source's labels file) against the file read with the csv module."""

from __future__ import annotations

import csv
import random
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import SourceError
from etl.sources.kinds import listing as listing_kind
from etl.sources.kinds.lmdb.key_labels import KeyLabels


def test_every_key_reads_back_what_the_file_says(tmp_path: Path) -> None:
    """5,000 keys in any spelling (spaces, accents, 'hex:', digits with leading zeros), labels
    of 30 classes with some empty, splits on some: each lookup is the csv module's reading,
    and keys the file does not list are (None, None)."""
    rng = random.Random(0)
    spellings = ["img/{:05d}.jpg", "ca fé/{:05d}", "hex:00{:05d}", "{:08d}", "dir/sub/ä{:d}"]
    keys = [rng.choice(spellings).format(i) for i in range(5_000)]
    path = tmp_path / "labels.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["key", "label", "split"])
        for key in keys:
            label = rng.choice([f"{rng.randrange(30):03d}", f"class {rng.randrange(30)}", ""])
            out.writerow([key, label, rng.choice(["", "train", "val"])])
    with open(path, newline="", encoding="utf-8") as f:
        expected = {
            row["key"]: (row["label"].strip() or None, row["split"] or None)
            for row in csv.DictReader(f)
        }
    labels = KeyLabels(path)
    assert len(labels) == len(expected) == len(keys)
    assert {key: labels.get(key) for key in expected} == expected
    for absent in ("img/99999.jpg", "", "IMG/00001.jpg", keys[0] + " "):
        assert labels.get(absent) == (None, None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("key,label\na,x\nb,y\na,z\n", ":line 4: key 'a' is listed twice (also line 2)"),
        ("key,label\na,x\n,y\n", ":line 3: empty key"),
        ("name,label\na,x\n", ": no column 'key'; columns are ['name', 'label']"),
    ],
)
def test_bad_labels_files_name_the_line(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "labels.csv").write_text(body)
    with pytest.raises(SourceError) as raised:
        KeyLabels(tmp_path / "labels.csv")
    assert str(raised.value).startswith(f"{tmp_path / 'labels.csv'}{message}")


def test_a_key_twice_far_apart_is_named_by_both_rows(tmp_path: Path, monkeypatch) -> None:
    """Parquet, read 1,000 rows at a time: the repeat is 40 batches after the first."""
    monkeypatch.setattr(listing_kind, "LISTING_BATCH", 1_000)
    keys = [f"k{i}" for i in range(50_000)]
    keys[45_000] = "k17"
    pq.write_table(pa.table({"key": keys, "label": ["x"] * len(keys)}), tmp_path / "l.parquet")
    with pytest.raises(SourceError) as raised:
        KeyLabels(tmp_path / "l.parquet")
    assert str(raised.value) == (
        f"{tmp_path / 'l.parquet'}:row 45000: key 'k17' is listed twice (also row 17)"
    )


def test_memory_per_key_is_a_few_bytes(tmp_path: Path, monkeypatch) -> None:
    """From 10,000 keys to 40,000 the lookup keeps 24 B a key (a dict of tuples kept ~200) and
    its peak while reading grows by under 100 B a key (Parquet, 1,000 rows a batch)."""
    monkeypatch.setattr(listing_kind, "LISTING_BATCH", 1_000)
    held, peaks = [], []
    for n in (100, 10_000, 40_000):  # the first imports what reading imports
        keys = [f"a/rather/long/key/of/a/record/{i:09d}.jpg" for i in range(n)]
        labels = [f"class-{i % 500}" for i in range(n)]
        pq.write_table(pa.table({"key": keys, "label": labels}), tmp_path / f"{n}.parquet")
        del keys, labels
        tracemalloc.start()
        try:
            lookup = KeyLabels(tmp_path / f"{n}.parquet")
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert lookup.get(f"a/rather/long/key/of/a/record/{n - 1:09d}.jpg") == (
            "class-" + str((n - 1) % 500),
            None,
        )
        held.append(current)
        peaks.append(peak)
    per_key = (held[2] - held[1]) / 30_000
    peak_per_key = (peaks[2] - peaks[1]) / 30_000
    assert per_key < 32, f"{per_key:.0f} B held per key ({held})"
    assert peak_per_key < 100, f"{peak_per_key:.0f} B peak per key ({peaks})"
