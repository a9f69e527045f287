from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from etl.config import FolderSource, ListingSource
from etl.errors import SourceError
from etl.format import names
from etl.sources.kinds.folder import list_folder
from etl.sources.kinds.listing import list_listing


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_folder_classes_sorted_hidden_skipped_links_contained(tmp_path: Path) -> None:
    root = tmp_path / "src"
    touch(root / "dog" / "b.JPG")
    touch(root / "dog" / "nested" / "a.png")
    touch(root / "cat" / "z.jpeg", b"12345")
    touch(root / "cat" / ".DS_Store")
    touch(root / ".hidden" / "x.jpg")
    touch(root / "cat" / "notes.txt")
    touch(root / "stray.jpg")
    outside = touch(tmp_path / "secret.jpg")
    os.symlink(outside, root / "cat" / "link.jpg")
    os.symlink(root / "dog" / "b.JPG", root / "cat" / "inside.jpg")
    os.symlink(tmp_path, root / "loop")  # a linked folder is never followed

    listing = list_folder(FolderSource(path=root))
    assert [f.source for f in listing.files] == [
        "cat/inside.jpg",
        "cat/z.jpeg",
        "dog/b.JPG",
        "dog/nested/a.png",
    ]
    assert [f.class_name for f in listing.files] == ["cat", "cat", "dog", "dog"]
    assert listing.files[1].size == 5
    reasons = {r.source: r.reason for r in listing.rejects}
    assert reasons == {"cat/link.jpg": "outside_root", "stray.jpg": "no_class"}
    assert listing.listed == 6


def test_folder_include_exclude(tmp_path: Path) -> None:
    root = tmp_path / "src"
    touch(root / "a" / "1.jpg")
    touch(root / "a" / "2.png")
    touch(root / "a" / "skip" / "3.jpg")
    source = FolderSource(path=root, include=("*.jpg",), exclude=("*/skip/*",))
    assert [f.source for f in list_folder(source).files] == ["a/1.jpg"]


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="is not a folder"):
        list_folder(FolderSource(path=tmp_path / "nope"))


def test_csv_listing(tmp_path: Path) -> None:
    touch(tmp_path / "img" / "a.jpg")
    touch(tmp_path / "img" / "b.jpg")
    (tmp_path / "list.csv").write_text(
        "path,label,split\nimg/b.jpg,dog,val\nimg/a.jpg,cat,\nimg/missing.jpg,cat,\n"
    )
    listing = list_listing(ListingSource(path=tmp_path / "list.csv"))
    assert [(f.source, f.class_name, f.split) for f in listing.files] == [
        ("img/a.jpg", "cat", None),
        ("img/b.jpg", "dog", "val"),
    ]
    assert [(r.source, r.reason) for r in listing.rejects] == [("img/missing.jpg", "missing")]


def test_a_listing_names_files_in_any_encoding(tmp_path: Path) -> None:
    """An old archive's listing in Latin-1: the names are not UTF-8, and neither is the CSV.
    Each row reaches its file; the manifest spells the name by the hex: rule."""
    latin = "café.jpg".encode("latin-1")
    (tmp_path / "img").mkdir()
    with open(os.fsencode(tmp_path / "img") + b"/" + latin, "wb") as f:
        f.write(b"x")
    touch(tmp_path / "img" / "plain.jpg")
    (tmp_path / "list.csv").write_bytes(b"path,label\nimg/" + latin + b",cat\nimg/plain.jpg,dog\n")
    listing = list_listing(ListingSource(path=tmp_path / "list.csv"))
    assert not listing.rejects
    by_source = {f.source: f for f in listing.files}
    hexed = names.to_source(b"img/" + latin)
    assert set(by_source) == {hexed, "img/plain.jpg"} and hexed.startswith("hex:")
    assert os.fsencode(by_source[hexed].path).endswith(latin)  # the very file, readable
    assert by_source[hexed].class_name == "cat"


def test_parquet_listing_with_integer_labels(tmp_path: Path) -> None:
    touch(tmp_path / "a.png")
    pq.write_table(pa.table({"file": ["a.png"], "label": [3]}), tmp_path / "l.parquet")
    listing = list_listing(ListingSource(path=tmp_path / "l.parquet", path_column="file"))
    assert listing.files[0].class_name == "3"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("file,label\na.jpg,x\n", "no column 'path'"),
        ("path,label\na.jpg,x\n./a.jpg,y\n", "list.csv:line 3: path './a.jpg' is listed twice"),
    ],
)
def test_bad_listings_name_the_line(tmp_path: Path, body: str, expected: str) -> None:
    touch(tmp_path / "a.jpg")
    (tmp_path / "list.csv").write_text(body)
    with pytest.raises(SourceError, match=expected.replace(".", r"\.")):
        list_listing(ListingSource(path=tmp_path / "list.csv"))


def test_bad_listing_rows_are_rejects_naming_their_line(tmp_path: Path) -> None:
    """One bad row never refuses the others: each is a reject whose message names its line."""
    base = tmp_path / "data"
    touch(base / "a" / "good.jpg")
    touch(base / "a" / "later.jpg")
    touch(tmp_path / "outside" / "secret.jpg")
    os.symlink(tmp_path / "outside" / "secret.jpg", base / "a" / "link.jpg")
    os.mkfifo(base / "a" / "pipe.jpg")
    (base / "a" / "folder.jpg").mkdir()
    (base / "list.csv").write_text(
        "path,label\n"
        "a/good.jpg,x\n"  # line 2
        "a/good2.jpg,x,extra\n"  # line 3: one field too many
        "../outside/secret.jpg,x\n"  # line 4
        "/etc/passwd,x\n"  # line 5
        ",x\n"  # line 6
        "a/link.jpg,x\n"  # line 7
        "a/pipe.jpg,x\n"  # line 8
        "a/folder.jpg,x\n"  # line 9
        "a/later.jpg,y\n"  # line 10
    )
    listing = list_listing(ListingSource(path=base / "list.csv"))
    assert [(f.source, f.class_name) for f in listing.files] == [
        ("a/good.jpg", "x"),
        ("a/later.jpg", "y"),
    ]
    found = {
        (r.reason, r.message.split(": ")[0] if "list.csv" in r.message else r.source)
        for r in listing.rejects
    }
    where = str(base / "list.csv")
    assert found == {
        ("bad_row", f"{where}:3"),
        ("outside_root", f"{where}:line 4"),
        ("outside_root", f"{where}:line 5"),
        ("bad_row", f"{where}:line 6"),
        ("outside_root", f"{where}:line 7"),
        ("not_a_file", "a/pipe.jpg"),
        ("not_a_file", "a/folder.jpg"),
    }
    assert listing.listed == 9


def long_listing(folder: Path, rows: int, twice_at: int | None = None) -> list[str]:
    """A listing of `rows` lines after the header (about 3 MB for 120k: several of Arrow's
    1 MiB read blocks), labels all digits ('007'); lines 3 and rows - 10 name real files, two
    lines in later blocks have a field too many, the rest name missing files; with
    `twice_at`, that line names line 3's file again. Returns the file's lines."""
    touch(folder / "a.jpg")
    touch(folder / "b.jpg")
    lines = ["path,label"] + [f"missing/{i:08d}.jpg,007" for i in range(2, rows + 2)]
    lines[3 - 1] = "a.jpg,007"
    lines[rows - 10 - 1] = "b.jpg,007"
    for bad in (50_000, 100_000):
        lines[bad - 1] += ",extra"
    if twice_at is not None:
        lines[twice_at - 1] = "./a.jpg,007"
    (folder / "list.csv").write_text("\n".join(lines) + "\n")
    return lines


@pytest.mark.slow
def test_a_long_listing_is_read_a_block_at_a_time(tmp_path: Path) -> None:
    """Labels of digits stay text ('007', not 7) in every block, bad rows in later blocks are
    rejects naming their lines, and every row is accounted for."""
    lines = long_listing(tmp_path, 120_000)
    listing = list_listing(ListingSource(path=tmp_path / "list.csv"))
    assert [(f.source, f.class_name) for f in listing.files] == [("a.jpg", "007"), ("b.jpg", "007")]
    bad = sorted(r.message.split(": ")[0] for r in listing.rejects if r.reason == "bad_row")
    assert bad == [f"{tmp_path / 'list.csv'}:{n}" for n in (100_000, 50_000)]
    assert listing.listed == len(lines) - 1
    assert len(listing.rejects) == len(lines) - 1 - 2


@pytest.mark.slow
def test_a_path_listed_twice_far_apart_names_both_lines(tmp_path: Path) -> None:
    """The second mention is in a later block, after two skipped bad rows: the error names the
    file's own line numbers and the cell as written."""
    long_listing(tmp_path, 120_000, twice_at=110_000)
    with pytest.raises(SourceError) as raised:
        list_listing(ListingSource(path=tmp_path / "list.csv"))
    assert str(raised.value) == (
        f"{tmp_path / 'list.csv'}:line 110000: path './a.jpg' is listed twice (also line 3)"
    )


def test_listing_kind_must_be_known(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("{}")
    with pytest.raises(SourceError, match=r"must be \.csv"):
        list_listing(ListingSource(path=tmp_path / "list.json"))


@pytest.mark.parametrize("scratch", [False, True])
def test_the_listing_builder_keeps_every_stat_value_and_name(tmp_path: Path, scratch: bool) -> None:
    """Numbers are collected in 8-byte arrays, not objects: the extremes of each must come
    back as they went in, in source order, on disk (a scratch folder, in batches) or not."""
    from etl.sources.entries import FileColumnsBuilder, FileStat

    builder = FileColumnsBuilder(tmp_path if scratch else None)
    builder.BATCH = 2  # every third file starts a new batch
    added = [
        ("b/x.jpg", "/r/b/x.jpg", "b", FileStat(0, -(2**62), 2**62, 2**64 - 1)),
        (
            names.path_to_source("a/\udcff.jpg"),
            "/r/a/\udcff.jpg",
            "a",
            FileStat(2**63 - 1, 0, -1, 0),
        ),
        ("a/z.jpg", "/r/a/z.jpg", None, FileStat(5, 1, 2, 3)),
    ]
    for source, path, class_name, stat in added:
        builder.add(source, path, class_name, stat)
    table = builder.build().table
    expected = sorted(added, key=lambda file: file[0].encode())
    assert table.column("source").to_pylist() == [s for s, *_ in expected]
    assert table.column("path").to_pylist() == [os.fsencode(p) for _, p, *_ in expected]
    assert table.column("class_name").to_pylist() == [c for *_, c, _ in expected]
    for i, name in enumerate(("size", "mtime_ns", "ctime_ns", "inode")):
        assert table.column(name).to_pylist() == [stat[i] for *_, stat in expected]
    assert table.column("content_hash").null_count == table.column("split").null_count == 3


SOURCES = [f"s{i:02d}" for i in range(30)] + ["é", "z/ü", "a b"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    taken=st.lists(st.sampled_from(SOURCES), max_size=60),
    drop=st.sets(st.sampled_from(SOURCES), max_size=8),
    scratch=st.booleans(),
    as_column=st.booleans(),
)
@example(taken=["s00", "s01", "s01"], drop=set(), scratch=True, as_column=False)  # two pieces
def test_the_builder_leaves_out_what_repeats_or_is_dropped(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    taken: list[str],
    drop: set[str],
    scratch: bool,
    as_column: bool,
) -> None:
    """A source added twice is found on the sorted listing, also when its copies fall in
    different batches, runs and merge pieces; checked against a plain Counter."""
    from etl.format import spill
    from etl.sources.entries import FileColumnsBuilder, FileStat

    monkeypatch.setattr(spill, "RUN_ROWS", 3)
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    monkeypatch.setattr(spill, "MERGE_ROWS", 2)
    monkeypatch.setattr(spill, "FAN_IN", 3)
    builder = FileColumnsBuilder(tmp_path_factory.mktemp("scratch") if scratch else None)
    builder.BATCH = 2
    for i, source in enumerate(taken):
        builder.add(source, f"/r/{source}", "c", FileStat(i, 0, 0, 0))
    if as_column:  # a sorted column (mapped from disk in a run), read a slice per piece
        column = pa.chunked_array([pa.array(sorted(drop, key=str.encode), pa.string())])
        table = builder.build(drop_sorted=column).table
    else:
        table = builder.build(drop=drop).table
    counts = Counter(taken)
    once = [s for s, n in counts.items() if n == 1]
    kept = sorted((s for s in once if s not in drop), key=str.encode)
    assert table.column("source").to_pylist() == kept
    assert builder.duplicates == sorted(s for s, n in counts.items() if n > 1)
    assert builder.dropped == sorted(s for s in once if s in drop)
    # each kept row is the one added for it
    assert [taken[i] for i in table.column("size").to_pylist()] == kept


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.lists(st.sampled_from([f"f{i:02d}" for i in range(12)]), max_size=14),
    rejected=st.lists(st.sampled_from([f"f{i:02d}" for i in range(6, 18)]), max_size=14),
    scratch=st.booleans(),
)
def test_listing_rejects_go_to_disk_and_a_source_taken_twice_is_one_reject(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    files: list[str],
    rejected: list[str],
    scratch: bool,
) -> None:
    """`ListingBuilder` with rejects in sorted runs on disk (many small batches): each source
    is a file, a reject or one 'duplicate' reject, checked against plain Counters."""
    from etl.format import spill
    from etl.sources.entries import FileColumnsBuilder, FileStat
    from etl.sources.intake import ListingBuilder
    from etl.sources.listed_rejects import RejectsBuilder, SourceReject

    monkeypatch.setattr(spill, "RUN_ROWS", 3)
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    monkeypatch.setattr(spill, "MERGE_ROWS", 2)
    monkeypatch.setattr(FileColumnsBuilder, "BATCH", 2)
    monkeypatch.setattr(RejectsBuilder, "BATCH", 2)
    builder = ListingBuilder(tmp_path_factory.mktemp("scratch") if scratch else None)
    for source in files:
        builder.files.add(source, f"/r/{source}", "c", FileStat(1, 0, 0, 0))
    for source in rejected:
        builder.reject(SourceReject(source, "missing", f"{source} is gone"))
    listing = builder.build(lambda s: ("duplicate", f"{s} twice"))
    as_file, as_reject = Counter(files), Counter(rejected)
    twice = {s for s in {*files, *rejected} if as_file[s] + as_reject[s] > 1}
    assert builder.duplicated == sorted(twice)
    assert listing.files.table.column("source").to_pylist() == sorted(
        s for s, n in as_file.items() if n == 1 and s not in as_reject
    )
    expected = {s: "missing" for s in as_reject if s not in twice} | dict.fromkeys(
        twice, "duplicate"
    )
    got = [(r.source, r.reason) for r in listing.rejects]
    assert got == sorted(expected.items())
    assert listing.listed == len({*files, *rejected})
