"""`source: lmdb`: real LMDB environments built in tmp_path, packed end to end, compared with an
independent Pillow decode of the value bytes."""

from __future__ import annotations

import io
import json
import pickle
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from etl.config import PipelineConfig, load_config
from etl.errors import ConfigError, SourceError
from etl.format.manifest import read_manifest
from etl.format.names import to_raw as source_to_key
from etl.format.names import to_source as key_to_source
from etl.maintenance.audit import audit
from etl.run import pipeline
from etl.sources.kinds.lmdb.keys_entry import listed_keys

lmdb = pytest.importorskip("lmdb")

SIZE = (16, 20)  # stored [height, width]


def encode(array: np.ndarray, fmt: str, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def picture(seed: int, height: int = 30, width: int = 40) -> np.ndarray:
    """Smooth colour ramps plus noise: JPEG-friendly, different for every seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (height + width)], -1)
    noise = rng.integers(0, 40, (height, width, 3))
    return ((base + noise + seed * 37) % 256).astype(np.uint8)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_env(path: Path, items: dict[bytes, bytes]) -> None:
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key, value)
    env.close()


def reference(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Plain Pillow: decode, to RGB, centre-crop resize (independent of etl.images.stages)."""
    if data.startswith(b"\x93NUMPY"):
        image = Image.fromarray(np.load(io.BytesIO(data)))
    else:
        image = Image.open(io.BytesIO(data))
    image = image.convert(mode)
    height, width = SIZE
    array = np.asarray(ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR))
    return array[:, :, None] if array.ndim == 2 else array


def make_config(tmp_path: Path, source: str, backend: str = "threading") -> PipelineConfig:
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"""\
source:
{source}
stages:
  - decode: {{}}
  - resize: {{size: [{SIZE[0]}, {SIZE[1]}]}}
output: {{dir: out, samples_per_shard: 3}}
run: {{n_jobs: 2, backend: {backend}}}
"""
    )
    return load_config(path)


def pixels(out: Path) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    manifest = read_manifest(out)
    return {
        row["source"]: (np.load(out / row["shard"], mmap_mode="r")[row["row"]], row)
        for row in manifest.samples.to_pylist()
    }


def reasons(out: Path) -> dict[str, str]:
    rejects = read_manifest(out).rejects.to_pylist()
    return {r["source"]: r["reason"] for r in rejects}


BINARY_KEY = b"\xffbin\x00key"


@pytest.fixture
def env_items() -> dict[bytes, bytes]:
    jpeg = encode(picture(1), "JPEG", quality=90)
    return {
        b"cat/001": jpeg,
        b"cat/002": encode(picture(2, 50, 30), "PNG"),
        b"dog/001": encode(picture(3), "PNG"),
        BINARY_KEY: encode(picture(4), "JPEG", quality=85),
        b"raw/001": npy(picture(5)),
        b"bad/truncated": jpeg[: len(jpeg) // 2],
        b"bad/garbage": b"this is not an image at all",
        b"bad/pickled": pickle.dumps({"image": encode(picture(6), "PNG"), "label": "cat"}, 4),
        b"nolabel": encode(picture(7), "PNG"),
        b"__len__": b"9",
    }


LABELS = {
    "cat/001": ("cat", "train"),
    "cat/002": ("cat", "val"),
    "dog/001": ("dog", ""),
    key_to_source(BINARY_KEY): ("dog", ""),
    "raw/001": ("cat", ""),
    "bad/truncated": ("dog", ""),
    "bad/garbage": ("dog", ""),
    "bad/pickled": ("cat", ""),
    "not/in/env": ("cat", ""),
}


def write_labels(path: Path) -> None:
    lines = ["key,label,split", *(f"{k},{lab},{split}" for k, (lab, split) in LABELS.items())]
    path.write_text("\n".join(lines) + "\n")


def test_key_encoding_is_readable_and_one_to_one() -> None:
    for key in (b"cat/001", BINARY_KEY, b"hex:abc", b"tab\there", "naïve".encode()):
        source = key_to_source(key)
        assert source_to_key(source) == key
        assert source.isprintable()
    assert key_to_source(b"cat/001") == "cat/001"
    assert key_to_source(BINARY_KEY) == "hex:" + BINARY_KEY.hex()
    assert key_to_source(b"hex:abc") == "hex:" + b"hex:abc".hex()


def test_cursor_scan_with_labels_csv(tmp_path: Path, env_items: dict[bytes, bytes]) -> None:
    write_env(tmp_path / "env", env_items)
    write_labels(tmp_path / "labels.csv")
    config = make_config(
        tmp_path,
        "  kind: lmdb\n  path: env\n  labels: labels.csv\n  meta_keys: ['__len__']",
        backend="loky",
    )
    report = pipeline.run(config)
    out = config.output.dir
    assert report.committed
    assert report.listed == len(env_items) - 1  # __len__ is a meta key, not a sample
    assert report.packed_new + report.rejected == report.listed
    assert reasons(out) == {
        "bad/truncated": "truncated",
        "bad/garbage": "unreadable",
        "bad/pickled": "pickle",
        "nolabel": "unknown_label",
    }
    message = next(r for r in read_manifest(out).rejects.to_pylist() if r["reason"] == "pickle")
    assert (
        "allow_pickle: true" in message["message"] and "runs arbitrary code" in message["message"]
    )

    stored = pixels(out)
    binary = key_to_source(BINARY_KEY)
    assert set(stored) == {"cat/001", "cat/002", "dog/001", binary, "raw/001"}
    for source, (array, row) in stored.items():
        value = env_items[source_to_key(source)]
        np.testing.assert_array_equal(array, reference(value), err_msg=source)
        assert row["source_size"] == len(value)
        assert row["source_mtime_ns"] == 0
        assert row["class_name"] == LABELS[source][0]
    assert stored["cat/001"][1]["split"] == "train"
    assert stored["cat/002"][1]["split"] == "val"
    assert stored["cat/002"][1]["source_height"] == 50

    result = audit(out)  # the audit reads shards and manifest only: any source kind works
    assert result.manifest_ok and not result.errors


def test_keys_entry_json_and_lines(tmp_path: Path, env_items: dict[bytes, bytes]) -> None:
    listed = ["cat/001", "dog/001", key_to_source(BINARY_KEY), "gone/001"]
    write_labels(tmp_path / "labels.csv")
    source = "  kind: lmdb\n  path: env\n  labels: labels.csv\n  keys_entry: __keys__"
    for i, entry in enumerate([json.dumps(listed).encode(), "\n".join(listed).encode() + b"\n"]):
        (tmp_path / "labels.csv").write_text(
            (tmp_path / "labels.csv").read_text() + "gone/001,cat,\n" * (i == 0)
        )
        write_env(tmp_path / "env", {**env_items, b"__keys__": entry})
        config = make_config(tmp_path, source)
        report = pipeline.run(config, rebuild=True)
        out = config.output.dir
        assert report.listed == 4
        assert set(pixels(out)) == {"cat/001", "dog/001", key_to_source(BINARY_KEY)}
        assert reasons(out) == {"gone/001": "missing"}


def test_keys_entry_pickle_is_refused_unless_allowed(
    tmp_path: Path, env_items: dict[bytes, bytes]
) -> None:
    write_env(tmp_path / "env", {**env_items, b"__keys__": pickle.dumps([b"cat/001", b"dog/001"])})
    write_labels(tmp_path / "labels.csv")
    source = "  kind: lmdb\n  path: env\n  labels: labels.csv\n  keys_entry: __keys__"
    with pytest.raises(SourceError) as info:
        pipeline.run(make_config(tmp_path, source))
    message = str(info.value)
    assert "'__keys__'" in message and "allow_pickle" in message and "\n" not in message

    config = make_config(tmp_path, source + "\n  allow_pickle: true")
    report = pipeline.run(config)
    assert set(pixels(config.output.dir)) == {"cat/001", "dog/001"}
    assert report.rejected == 0


def test_allow_pickle_with_label_field(tmp_path: Path) -> None:
    images = {
        b"a": encode(picture(11), "PNG"),
        b"b": encode(picture(12), "JPEG", quality=90),
        b"c": picture(13),  # a pickled uint8 array: packed through the .npy path
    }
    items = {
        b"a": pickle.dumps({"image": images[b"a"], "label": "cat", "extra": 1}, 4),
        b"b": pickle.dumps({"image": images[b"b"], "label": np.int64(3)}, 5),
        b"c": pickle.dumps({"image": images[b"c"], "label": "cat"}, 4),
        b"d": pickle.dumps({"pixels": images[b"a"], "label": "cat"}, 4),  # no image field
        b"e": encode(picture(14), "PNG"),  # not pickled: has no label field
    }
    write_env(tmp_path / "env", items)
    source = "  kind: lmdb\n  path: env\n  allow_pickle: true\n  label_field: label"
    config = make_config(tmp_path, source)
    report = pipeline.run(config)
    out = config.output.dir
    assert report.packed_new + report.rejected == report.listed == 5
    assert reasons(out) == {"d": "unreadable", "e": "unknown_label"}
    stored = pixels(out)
    assert {s: row["class_name"] for s, (_, row) in stored.items()} == {
        "a": "cat",
        "b": "3",
        "c": "cat",
    }
    for key in (b"a", b"b"):
        np.testing.assert_array_equal(stored[key.decode()][0], reference(images[key]))
    np.testing.assert_array_equal(stored["c"][0], reference(npy(images[b"c"])))
    assert stored["a"][1]["source_size"] == len(images[b"a"])  # the image field, not the record


def test_changed_value_of_same_length_is_repacked(tmp_path: Path) -> None:
    # BMP is uncompressed: new pixels, same number of bytes
    items = {f"k{i}".encode(): encode(picture(20 + i), "BMP") for i in range(5)}
    items[b"k9"] = npy(picture(29))
    write_env(tmp_path / "env", items)
    (tmp_path / "labels.csv").write_text(
        "key,label\n" + "".join(f"{k.decode()},c{i % 2}\n" for i, k in enumerate(items))
    )
    config = make_config(tmp_path, "  kind: lmdb\n  path: env\n  labels: labels.csv")
    first = pipeline.run(config)
    assert first.packed_new == 6
    before = pixels(config.output.dir)

    changed = {b"k2": encode(picture(99), "BMP"), b"k9": npy(picture(98))}
    assert all(len(changed[k]) == len(items[k]) for k in changed)
    write_env(tmp_path / "env", changed)
    second = pipeline.run(config)
    assert second.committed and second.packed_new == 2 and second.reused == 4
    after = pixels(config.output.dir)
    for source, (array, row) in after.items():
        key = source.encode()
        if key in changed:
            np.testing.assert_array_equal(array, reference(changed[key]))
            assert row["source_hash"] != before[source][1]["source_hash"]
            assert row["shard"] != before[source][1]["shard"]
        else:
            assert (row["shard"], row["row"]) == (
                before[source][1]["shard"],
                before[source][1]["row"],
            )

    third = pipeline.run(config)
    assert not third.committed and third.packed_new == 0


def test_config_and_source_errors(tmp_path: Path, env_items: dict[bytes, bytes]) -> None:
    with pytest.raises(ConfigError, match=r"labels .* or label_field"):
        make_config(tmp_path, "  kind: lmdb\n  path: env")
    with pytest.raises(
        ConfigError, match=r"pipeline.yaml:1: source: .*label_field .*allow_pickle: true"
    ):
        make_config(tmp_path, "  kind: lmdb\n  path: env\n  label_field: label")
    write_labels(tmp_path / "labels.csv")
    with pytest.raises(SourceError, match="not an LMDB environment"):
        pipeline.run(make_config(tmp_path, "  kind: lmdb\n  path: env\n  labels: labels.csv"))
    write_env(tmp_path / "env", env_items)
    (tmp_path / "bad.csv").write_text("name,label\ncat/001,cat\n")
    with pytest.raises(SourceError, match="no column 'key'"):
        pipeline.run(make_config(tmp_path, "  kind: lmdb\n  path: env\n  labels: bad.csv"))
    (tmp_path / "twice.csv").write_text("key,label\ncat/001,cat\ncat/001,dog\n")
    with pytest.raises(SourceError, match=r"twice.csv:line 3: key 'cat/001' is listed twice"):
        pipeline.run(make_config(tmp_path, "  kind: lmdb\n  path: env\n  labels: twice.csv"))


def test_numeric_keys_keep_their_zeros(tmp_path: Path) -> None:
    items = {f"{i:08d}".encode(): encode(picture(40 + i), "PNG") for i in range(3)}
    write_env(tmp_path / "env", items)
    (tmp_path / "labels.csv").write_text("key,label\n00000000,1\n00000001,2\n00000002,1\n")
    config = make_config(tmp_path, "  kind: lmdb\n  path: env\n  labels: labels.csv")
    report = pipeline.run(config, dry_run=True)
    assert report.rejected == 0 and report.plan_counts["to_pack"] == 3
    assert not (tmp_path / "out").exists()  # a dry run writes nothing, not even a spool
    pipeline.run(config)
    assert {s: row["class_name"] for s, (_, row) in pixels(config.output.dir).items()} == {
        "00000000": "1",
        "00000001": "2",
        "00000002": "1",
    }


KEYS_SOURCE = "  kind: lmdb\n  path: env\n  labels: labels.csv\n  keys_entry: __keys__"


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ('["cat/001", 7]', "expected a list of key strings, found 7"),
        ('["cat/001", ["dog/001"]]', "expected a list of key strings"),
        ('["cat/001", "dog/001"', "invalid JSON (the list has no closing ']')"),
        ('["cat/001",]', r"invalid JSON \(Expecting value: line 1 column 12"),
        ('["cat/001"] ["dog/001"]', "invalid JSON (extra data after the list at char 12)"),
        ('["cat/001" "dog/001"]', "invalid JSON (expected ',' or ']' at char 11)"),
        ('["cat/001", "dog/\\x"]', r"invalid JSON \(Invalid \\escape"),
    ],
)
def test_keys_entry_errors_name_the_entry(
    tmp_path: Path, env_items: dict[bytes, bytes], entry: str, error: str
) -> None:
    """A keys entry that is not a JSON list of strings stops the run with one line naming
    the environment, the entry and where in it (the list is read one key at a time)."""
    write_labels(tmp_path / "labels.csv")
    write_env(tmp_path / "env", {**env_items, b"__keys__": entry.encode()})
    with pytest.raises(SourceError) as info:
        pipeline.run(make_config(tmp_path, KEYS_SOURCE))
    message = str(info.value)
    assert "keys_entry '__keys__'" in message and "\n" not in message
    assert re.search(error if "\\(" in error else re.escape(error), message), message


@pytest.mark.slow
@pytest.mark.parametrize("form", ["json", "lines"])
def test_a_long_keys_entry_is_read_one_key_at_a_time(tmp_path: Path, form: str) -> None:
    """200,000 keys: listed in their order (a JSON list as json.loads reads it, lines as
    splitlines does), a key repeated 150,000 places later is named, and at most 64 bytes a key
    are held at the peak; parsing the whole list at once, with a Counter of it, took about 200."""
    keys = [f"img/{i:07d}" for i in range(200_000)] + ["naïve \u2028 key"]
    raw = (json.dumps(keys) if form == "json" else "\n".join(["", *keys, ""])).encode()
    config = make_config(tmp_path, KEYS_SOURCE).source
    listed_keys(raw[:100], config, "warm-up") if form == "lines" else None
    tracemalloc.start()
    try:
        count = sum(1 for _ in listed_keys(raw, config, "entry"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    expected = [k.encode() for k in json.loads(raw)] if form == "json" else None
    got = list(listed_keys(raw, config, "entry"))
    if form == "lines":
        expected = [line.strip().encode() for line in raw.decode().splitlines() if line.strip()]
    assert got == expected and count == len(expected) == len(keys) + (form == "lines")
    assert peak / len(keys) < 64, peak / len(keys)
    again = [*keys[:150_050], keys[50], *keys[150_050:]]
    raw = (json.dumps(again) if form == "json" else "\n".join(again)).encode()
    with pytest.raises(SourceError, match=r"^entry lists keys twice: \['img/0000050'\]$"):
        listed_keys(raw, config, "entry")


def test_a_bad_keys_entry_stops_etl_run_with_one_line(
    tmp_path: Path, env_items: dict[bytes, bytes]
) -> None:
    """As a user meets it: `python -m etl run` in a subprocess, under a time limit, with an
    unclosed list and then a repeated key: exit status 2 (bad input), one line naming the entry, no
    traceback, and no version written."""
    write_labels(tmp_path / "labels.csv")
    for entry, said in [
        ('["cat/001", "dog/001"', "the list has no closing ']'"),
        ('["cat/001", "dog/001", "cat/001"]', "lists keys twice: ['cat/001']"),
    ]:
        write_env(tmp_path / "env", {**env_items, b"__keys__": entry.encode()})
        config = make_config(tmp_path, KEYS_SOURCE)
        done = subprocess.run(
            [sys.executable, "-m", "etl", "run", str(tmp_path / "pipeline.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert "keys_entry '__keys__'" in lines[0] and said in lines[0], lines[0]
        assert not list(config.output.dir.glob("versions/v*")), "a version was written"
