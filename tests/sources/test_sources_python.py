"""`source: python`: a user function's records packed end to end, through the spool."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from etl.config import PipelineConfig, load_config
from etl.errors import ConfigError, SourceError
from etl.format.manifest import read_manifest
from etl.run import pipeline

SIZE = (12, 16)

# The user module: records described by items/index.json, so each test controls them on disk.
MODULE = """\
import json
from pathlib import Path

import numpy as np


def records(folder):
    root = Path(folder)
    for item in json.loads((root / "index.json").read_text()):
        payload = (root / item["file"]).read_bytes() if item.get("file") else None
        if item["form"] == "array":
            yield {"id": item["id"], "array": np.load(root / item["file"]), "label": item["label"]}
        elif item["form"] == "tuple":
            yield (item["id"], payload, item["label"], item.get("split"))
        else:
            yield {"id": item["id"], "data": payload, "label": item["label"],
                   "split": item.get("split")}


def broken(folder):
    yield {"id": "a", "data": b"x", "label": "c"}
    raise RuntimeError("the service went away")


def not_records(folder):
    return [42]
"""

_names = itertools.count()


def encode(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt)
    return buffer.getvalue()


def picture(seed: int, height: int = 24, width: int = 30) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * y) % 256], -1)
    return ((base + rng.integers(0, 30, (height, width, 3))) % 256).astype(np.uint8)


def reference(image: Image.Image) -> np.ndarray:
    """Independent of etl.images.stages: to RGB, centre-crop resize with Pillow."""
    height, width = SIZE
    return np.asarray(
        ImageOps.fit(image.convert("RGB"), (width, height), Image.Resampling.BILINEAR)
    )


class Source:
    """A folder of items plus a uniquely named copy of MODULE (modules are cached by name)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.items = tmp_path / "items"
        self.items.mkdir(parents=True)
        self.module = f"user_records_{next(_names)}"
        (tmp_path / f"{self.module}.py").write_text(MODULE)
        self.index: list[dict[str, Any]] = []

    def add(
        self, rid: Any, data: bytes | np.ndarray, label: Any, form: str = "dict", **kw: Any
    ) -> None:
        name = f"{len(self.index)}.{'npy' if isinstance(data, np.ndarray) else 'bin'}"
        if isinstance(data, np.ndarray):
            np.save(self.items / name, data)
        else:
            (self.items / name).write_bytes(data)
        self.index.append({"id": rid, "file": name, "label": label, "form": form, **kw})

    def config(self, function: str = "records", spec: str | None = None) -> PipelineConfig:
        (self.items / "index.json").write_text(json.dumps(self.index))
        path = self.tmp / "pipeline.yaml"
        path.write_text(
            f"""\
source:
  kind: python
  function: "{spec or f"{self.module}:{function}"}"
  options: {{folder: {self.items}}}
  split: {{val: 0.5}}
stages:
  - decode: {{}}
  - resize: {{size: [{SIZE[0]}, {SIZE[1]}]}}
output: {{dir: out, samples_per_shard: 2}}
run: {{n_jobs: 2, backend: threading}}
"""
        )
        return load_config(path)


def stored(out: Path) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    return {
        row["source"]: (np.load(out / row["shard"], mmap_mode="r")[row["row"]], row)
        for row in read_manifest(out).samples.to_pylist()
    }


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "shards").iterdir() if p.name.startswith(".tmp-"))


def test_bytes_and_arrays_are_packed(tmp_path: Path) -> None:
    src = Source(tmp_path)
    jpeg, png = encode(picture(1), "JPEG"), encode(picture(2, 40, 20), "PNG")
    rgb, grey = picture(3), picture(4)[:, :, 0]
    src.add("photo/1", jpeg, "cat", split="test")
    src.add(2, png, "dog", form="tuple")
    src.add("raw-rgb", rgb, "cat", form="array")
    src.add("raw-grey", grey, 7, form="array")
    src.add("broken", b"not an image", "cat")
    src.add("nolabel", png, None)
    config = src.config()
    report = pipeline.run(config)
    out = config.output.dir

    assert report.listed == 6 and report.packed_new == 4
    rejects = {r["source"]: r["reason"] for r in read_manifest(out).rejects.to_pylist()}
    assert rejects == {"broken": "unreadable", "nolabel": "unknown_label"}
    samples = stored(out)
    assert set(samples) == {"photo/1", "2", "raw-rgb", "raw-grey"}
    np.testing.assert_array_equal(samples["photo/1"][0], reference(Image.open(io.BytesIO(jpeg))))
    np.testing.assert_array_equal(samples["2"][0], reference(Image.open(io.BytesIO(png))))
    np.testing.assert_array_equal(samples["raw-rgb"][0], reference(Image.fromarray(rgb)))
    np.testing.assert_array_equal(samples["raw-grey"][0], reference(Image.fromarray(grey)))
    assert samples["photo/1"][1]["split"] == "test"
    assert samples["raw-grey"][1]["class_name"] == "7"
    assert samples["2"][1]["source_size"] == len(png)
    assert leftovers(out) == []  # the spool is gone

    again = pipeline.run(config)
    assert not again.committed and again.packed_new == 0 and again.reused == 4
    assert leftovers(out) == []


def test_array_modes(tmp_path: Path) -> None:
    """RGBA pixels are composited onto white like an RGBA PNG; float pixels are refused."""
    src = Source(tmp_path)
    rgba = np.dstack([picture(5), np.linspace(0, 255, 24 * 30).reshape(24, 30).astype(np.uint8)])
    src.add("rgba", rgba, "cat", form="array")
    src.add("float", picture(6).astype(np.float32), "cat", form="array")
    config = src.config()
    report = pipeline.run(config)
    rejects = read_manifest(config.output.dir).rejects.to_pylist()
    assert report.packed_new == 1 and [(r["source"], r["reason"]) for r in rejects] == [
        ("float", "unsupported_mode")
    ]
    white = Image.new("RGBA", (30, 24), (255, 255, 255, 255))
    expected = reference(Image.alpha_composite(white, Image.fromarray(rgba)))
    got = stored(config.output.dir)["rgba"][0].astype(int)
    assert np.abs(got - expected.astype(int)).max() <= 1  # premultiplied vs straight rounding


def test_only_new_content_is_spooled_and_packed(tmp_path: Path) -> None:
    src = Source(tmp_path)
    for i in range(4):
        src.add(f"r{i}", encode(picture(10 + i), "PNG"), "cat")
    config = src.config()
    assert pipeline.run(config).packed_new == 4
    before = stored(config.output.dir)

    changed = encode(picture(99), "PNG")
    (src.items / src.index[1]["file"]).write_bytes(changed)
    spool_sizes: list[int] = []

    def look(plan: Any) -> None:
        spool_sizes.extend(
            p.stat().st_size for p in (config.output.dir / "shards").glob(".tmp-spool-*")
        )

    report = pipeline.run(config, on_plan=look)
    assert report.committed and report.packed_new == 1 and report.reused == 3
    assert spool_sizes == [len(changed)]  # only the changed record was written for the workers
    after = stored(config.output.dir)
    np.testing.assert_array_equal(after["r1"][0], reference(Image.open(io.BytesIO(changed))))
    assert after["r0"][1]["shard"] == before["r0"][1]["shard"]


def test_killed_runs_spool_is_removed(tmp_path: Path) -> None:
    src = Source(tmp_path)
    src.add("a", encode(picture(1), "PNG"), "cat")
    config = src.config()
    (config.output.dir / "shards").mkdir(parents=True)
    (config.output.dir / "shards" / ".tmp-spool-999999.bin").write_bytes(b"left by kill -9")
    pipeline.run(config)
    assert leftovers(config.output.dir) == []


def test_duplicate_ids_are_an_error_naming_them(tmp_path: Path) -> None:
    src = Source(tmp_path)
    png = encode(picture(1), "PNG")
    for rid in ("a", "b", "a", 1, "1"):
        src.add(rid, png, "cat")
    with pytest.raises(SourceError) as info:
        pipeline.run(src.config())
    message = str(info.value)
    assert "'1' (records 3, 4)" in message and "'a' (records 0, 2)" in message
    assert "'b'" not in message and "\n" not in message
    assert leftovers(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("function", "error", "text"),
    [
        (None, ConfigError, "pipeline.yaml:3: source.function: String should match pattern"),
        ("missing", SourceError, "has no 'missing'"),
        ("broken", SourceError, "raised RuntimeError after 1 record(s): the service went away"),
        ("not_records", SourceError, "record 0 is a int; expected a dict"),
    ],
)
def test_bad_function_is_one_line(
    tmp_path: Path, function: str | None, error: type[Exception], text: str
) -> None:
    src = Source(tmp_path)
    with pytest.raises(error) as info:
        config = src.config(function) if function else src.config(spec="no.colon")
        pipeline.run(config)
    assert text in str(info.value) and "\n" not in str(info.value)


def test_unimportable_module_and_bad_ids(tmp_path: Path) -> None:
    src = Source(tmp_path)
    src.module = "no_such_module_anywhere"
    with pytest.raises(SourceError, match="cannot import 'no_such_module_anywhere'"):
        pipeline.run(src.config())
    src = Source(tmp_path / "two")
    src.add(1.5, encode(picture(1), "PNG"), "cat")
    with pytest.raises(SourceError, match=r"record 0: id 1.5 is a float; use a str or an int"):
        pipeline.run(src.config())


def test_the_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / "python_source.py"
    spec = importlib.util.spec_from_file_location("python_source_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("first run: version 1, committed True, packed 24")
    assert lines[1].startswith("second run: version 1, committed False, packed 0, reused 24")


def test_duplicate_ids_far_apart_are_found_across_batches_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Duplicates are found on the sorted listing on disk, not in a set of every id: copies
    that land in different batches, runs and merge pieces, and a copy that is a reject (no
    label), are all named with their record numbers."""
    from etl.format import spill
    from etl.sources.entries import FileColumnsBuilder

    monkeypatch.setattr(FileColumnsBuilder, "BATCH", 3)
    monkeypatch.setattr(spill, "RUN_ROWS", 4)
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    monkeypatch.setattr(spill, "MERGE_ROWS", 2)
    monkeypatch.setattr(spill, "FAN_IN", 3)
    src = Source(tmp_path)
    png = encode(picture(1), "PNG")
    ids = [f"r{i:02d}" for i in range(40)]
    ids[37] = "r00"  # far from its first copy
    ids[20] = "r05"  # r05 has no label: a reject, and a sample here
    for i, rid in enumerate(ids):
        src.add(rid, png, None if i == 5 else "cat")
    with pytest.raises(SourceError) as info:
        pipeline.run(src.config())
    message = str(info.value)
    assert "'r00' (records 0, 37)" in message and "'r05' (records 5, 20)" in message
    assert "ids are not unique" in message and "'r01'" not in message
    assert leftovers(tmp_path / "out") == []


def test_listing_records_holds_no_python_object_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records listed become Arrow columns on disk a batch at a time: from 3,000 records
    to 12,000, the Python memory a listing holds at its peak grows by the 8-byte hash of each
    id that names duplicates (`Occurrences`) and no more; objects per record cost hundreds.
    tracemalloc sees Python objects (and the arrays the batches are made from), not Arrow's
    own buffers."""
    import tracemalloc

    from etl.config import PythonSource
    from etl.format import spill
    from etl.sources.entries import FileColumnsBuilder, ListContext
    from etl.sources.kinds.python import list_python

    module = tmp_path / "many_records.py"
    module.write_text(
        "def records(count):\n"
        "    for i in range(count):\n"
        "        yield (f'record-{i:06d}', b'bytes of record %d' % i, 'class-%d' % (i % 7))\n"
    )
    monkeypatch.setattr(spill, "RUN_ROWS", 1_000)
    monkeypatch.setattr(FileColumnsBuilder, "BATCH", 500)
    peaks = []
    for count in (100, 3_000, 12_000):  # the first imports what listing imports
        config = PythonSource(
            kind="python", path=tmp_path, function="many_records:records", options={"count": count}
        )
        scratch = tmp_path / f"scratch-{count}"
        scratch.mkdir()
        context = ListContext(checksum="xxh3_64", scratch=scratch)
        tracemalloc.start()
        try:
            listing = list_python(config, context)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(listing.files) == count and not listing.rejects
        assert listing.files.table.column("source")[count - 1].as_py() == f"record-{count - 1:06d}"
    per_record = (peaks[2] - peaks[1]) / 9_000
    assert per_record < 24, f"{per_record:.0f} B of Python memory per record ({peaks})"
