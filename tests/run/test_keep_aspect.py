"""Samples that keep their aspect ratio (`resize: {mode: keep_aspect}`, format version 2), end to
end as a user meets them: `etl run`, a rerun, `etl audit`, and the loaders. The oracle is plain
Pillow (the source resized to the size the rule gives, computed here in floats), and plain numpy
and pyarrow reads of what was written, as docs/FORMAT.md tells a reader without our code."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from etl.storage.location import StoreOptions
from loaders import PackedDataset, RandomResizedCrop, make_loader
from loaders.batch.types import SIZE_COLUMNS
from tests.helpers.aspect import (
    LONGER,
    SHORTER,
    oracle_pixels,
    read_plainly,
    write_config,
    write_sources,
)
from tests.helpers.cli import cli

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_keep_aspect_packs_each_photo_at_its_own_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str
) -> None:
    write_sources(tmp_path / "images")
    code, _, err = cli(["run", str(write_config(tmp_path, layout))], capsys)
    assert code == 0, err
    meta, rows = read_plainly(tmp_path / "out")
    assert json.loads(meta[b"etl.format_version"]) == 2
    assert json.loads(meta[b"etl.sample_shape"]) == ([0, 0, 3] if layout == "HWC" else [3, 0, 0])
    assert len(rows) == 14
    for row in rows:
        source = tmp_path / "images" / row["source"]
        expected = oracle_pixels(source)
        assert (row["sample_height"], row["sample_width"]) == expected.shape[:2]
        assert np.array_equal(row["pixels"], expected), row["source"]
    by_name = {r["source"]: r for r in rows}
    assert (by_name["dog/00.png"]["sample_height"], by_name["dog/00.png"]["sample_width"]) == (
        4,
        40,
    )
    assert (by_name["cat/01.png"]["sample_height"], by_name["cat/01.png"]["sample_width"]) == (
        12,
        15,
    )
    # Each shard is exactly its samples' bytes after a 128-byte header: no slot padding left.
    with ipc.open_file(tmp_path / "out/versions/v000001/shards.arrow") as reader:
        shards = reader.read_all().to_pylist()
    for shard in shards:
        mine = [r for r in rows if r["shard"] == shard["shard"]]
        stored = sum(r["pixels"].size for r in mine)
        assert shard["bytes"] == 128 + stored == (tmp_path / "out" / shard["shard"]).stat().st_size
        assert sorted(r["row"] for r in mine) == list(range(shard["rows"]))
        ends = sorted((r["sample_offset"], r["pixels"].size) for r in mine)
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(ends))


def test_keep_aspect_output_is_the_same_whatever_the_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = []
    for jobs, backend in ((1, "sequential"), (2, "loky"), (2, "threading")):
        folder = tmp_path / f"{backend}-{jobs}"
        write_sources(folder / "images")
        code, _, err = cli(["run", str(write_config(folder, jobs=jobs, backend=backend))], capsys)
        assert code == 0, err
        shards = {p.name: p.read_bytes() for p in sorted((folder / "out/shards").iterdir())}
        with ipc.open_file(folder / "out/versions/v000001/manifest.arrow") as reader:
            table = reader.read_all().drop_columns(["source_mtime_ns", "source_ctime_ns"])
        outputs.append((shards, table.drop_columns(["source_inode"]).to_pylist()))
    assert outputs[0] == outputs[1] == outputs[2]


def test_keep_aspect_reruns_audits_and_names_a_damaged_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sources(tmp_path / "images")
    config = write_config(tmp_path)
    assert cli(["run", str(config)], capsys)[0] == 0
    code, out, _ = cli(["run", str(config)], capsys)
    assert code == 0 and "nothing changed" in out
    before = {p.name: p.read_bytes() for p in (tmp_path / "out/shards").iterdir()}
    Image.new("RGB", (90, 30), (9, 8, 7)).save(tmp_path / "images/cat/new.png")
    assert cli(["run", str(config)], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out", 2)
    new = next(r for r in rows if r["source"] == "cat/new.png")
    assert new["shard"].startswith("shards/v000002-") and new["pixels"].shape == (13, 40, 3)
    assert np.array_equal(new["pixels"], oracle_pixels(tmp_path / "images/cat/new.png"))
    for name, data in before.items():
        assert (tmp_path / "out/shards" / name).read_bytes() == data
    code, out, _ = cli(["audit", str(tmp_path / "out"), "--jobs", "1"], capsys)
    assert code == 0, out

    victim = next(r for r in rows if r["source"] == "dog/04.png")
    path = tmp_path / "out" / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out, _ = cli(["audit", str(tmp_path / "out"), "--jobs", "1"], capsys)
    assert code != 0
    assert "dog/04.png" in out and "sample_checksum" in out


def test_keep_aspect_loads_own_sizes_and_crops_from_the_whole_photo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out")
    pixels = {r["source"]: r["pixels"] for r in rows}
    dataset = PackedDataset.open(tmp_path / "out")
    assert dataset.ragged and len(dataset) == 14
    for i in range(len(dataset)):
        image, _label = dataset[i]
        source = dataset.manifest_rows([i]).column("source")[0].as_py()
        assert np.array_equal(image.numpy(), pixels[source])
    loader = make_loader(dataset, batch_size=4, shuffle=True, pin_memory=False)
    crop = RandomResizedCrop(16, seed=5)
    seen = 0
    for images, labels, indices, columns in loader:
        heights, widths = columns[SIZE_COLUMNS[0]], columns[SIZE_COLUMNS[1]]
        assert images.shape[1:3] == (int(heights.max()), int(widths.max()))
        nchw = images.permute(0, 3, 1, 2)
        out = crop(nchw, indices, epoch=0, sizes=(heights.numpy(), widths.numpy()))
        assert out.shape == (len(labels), 3, 16, 16)
        for j, index in enumerate(indices.tolist()):
            own, _ = dataset[index]
            h, w = own.shape[:2]
            assert (int(heights[j]), int(widths[j])) == (h, w)
            assert not images[j, h:].any() and not images[j, :, w:].any()  # zero padding
            alone = crop(own.permute(2, 0, 1)[None], torch.tensor([index]), epoch=0)
            assert torch.equal(out[j], alone[0])  # drawn from its own image, never the padding
        seen += len(labels)
    assert seen == 14


def test_keep_aspect_config_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sources(tmp_path / "images", count=2)
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(f", longer: {LONGER}", ""))
    code, _, err = cli(["run", str(config)], capsys)
    assert code == 2 and "Traceback" not in err
    assert "pipeline.yaml:4" in err and "needs shorter and longer" in err


def test_keep_aspect_repairs_and_compacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged sample is decoded again and its shard's good samples copied; deleting most of
    a shard's sources and compacting rewrites it; every version reads back as Pillow says."""
    write_sources(tmp_path / "images")
    config = write_config(tmp_path)
    assert cli(["run", str(config)], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out")
    victim = next(r for r in rows if r["source"] == "cat/05.png")
    path = tmp_path / "out" / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + victim["pixels"].size - 1] ^= 0x55
    path.write_bytes(bytes(data))
    code, out, _ = cli(
        ["audit", str(tmp_path / "out"), "--repair", "--config", str(config)], capsys
    )
    assert code == 0, out
    _, repaired = read_plainly(tmp_path / "out", 2)
    assert {r["source"] for r in repaired} == {r["source"] for r in rows}
    for row in repaired:
        assert np.array_equal(row["pixels"], oracle_pixels(tmp_path / "images" / row["source"]))
    assert next(r for r in repaired if r["source"] == "cat/05.png")["shard"].startswith(
        "shards/v000002-"
    )

    doomed = [r for r in repaired if r["shard"] == repaired[0]["shard"]][1:]
    for row in doomed:
        (tmp_path / "images" / row["source"]).unlink()
    assert cli(["run", str(config)], capsys)[0] == 0
    code, out, _ = cli(
        ["compact", str(tmp_path / "out"), "--min-dead", "0.1", "--grace", "0"], capsys
    )
    assert code == 0, out
    latest = max(int(p.name[1:]) for p in (tmp_path / "out/versions").iterdir())
    _, compacted = read_plainly(tmp_path / "out", latest)
    assert len(compacted) == 14 - len(doomed)
    for row in compacted:
        assert np.array_equal(row["pixels"], oracle_pixels(tmp_path / "images" / row["source"]))
    assert cli(["audit", str(tmp_path / "out"), "--jobs", "1"], capsys)[0] == 0


def test_centre_crops_and_plain_resizes_of_a_padded_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each sample of a padded batch, at its own size: torchvision's Resize + CenterCrop
    (F.interpolate of the whole image, then the centre) and a plain resize, computed here per
    sample; the one-`grid_sample` path CUDA takes equals them on the CPU too."""
    from loaders import CenterCrop, Resize
    from loaders.augment.crops import center_crops

    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    dataset = PackedDataset.open(tmp_path / "out")
    batch = dataset.gather(list(range(len(dataset))))
    heights, widths = (batch.columns[name].numpy() for name in SIZE_COLUMNS)
    nchw = batch.images.permute(0, 3, 1, 2)
    cropped = CenterCrop(8, resize=10)(nchw, batch.indices, 0, sizes=(heights, widths))
    at_once = center_crops(nchw, heights, widths, 10, (8, 8))
    resized = Resize((9, 7))(nchw, batch.indices, 0, sizes=(heights, widths))
    for j in range(len(dataset)):
        own = dataset[int(batch.indices[j])][0].permute(2, 0, 1)[None].float()
        h, w = own.shape[2:]
        rh, rw = (10, int(10 * w / h)) if h <= w else (int(10 * h / w), 10)
        whole = F.interpolate(own, (rh, rw), mode="bilinear", align_corners=False)
        top, left = round((rh - 8) / 2), round((rw - 8) / 2)
        want = whole[0, :, top : top + 8, left : left + 8]
        torch.testing.assert_close(cropped[j], want, atol=1e-4, rtol=0)
        torch.testing.assert_close(at_once[j], want, atol=2e-3, rtol=0)
        plain = F.interpolate(own, (9, 7), mode="bilinear", align_corners=False)[0]
        torch.testing.assert_close(resized[j], plain, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_keep_aspect_into_a_bucket_and_read_back_by_url(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`etl run` into object storage (moto on 127.0.0.1) publishes a version 2 dataset; a
    training node reads each sample by URL at its own size, as Pillow says it is."""
    import subprocess
    import sys

    from etl.errors import ShardError
    from tests.helpers.stores import new_bucket, point_at

    point_at(endpoint, monkeypatch, tmp_path / "cache")
    new_bucket(endpoint, "aspect")
    write_sources(tmp_path / "images", count=8)
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("dir: out", "dir: s3://aspect/ds"))
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--quiet"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    dataset = PackedDataset.open("s3://aspect/ds")
    assert dataset.ragged and len(dataset) == 8
    for i in range(len(dataset)):
        source = dataset.manifest_rows([i]).column("source")[0].as_py()
        expected = oracle_pixels(tmp_path / "images" / source)
        assert np.array_equal(dataset[i][0].numpy(), expected)
    for workers in (0, 2):  # ranged GETs: each sample's bytes, verified; no shard fetched
        ranged = PackedDataset.open(
            "s3://aspect/ds", store=StoreOptions(ranged=True, cache_dir=tmp_path / "bare")
        )
        loader = make_loader(  # fresh workers each epoch: they take the form asked below
            ranged, batch_size=3, num_workers=workers, workers_as="processes",
            persistent_workers=False, with_indices=True,
        )  # fmt: skip
        count = 0
        for images, _, indices, columns in loader:
            for j, i in enumerate(indices.tolist()):
                source = ranged.manifest_rows([i]).column("source")[0].as_py()
                expected = oracle_pixels(tmp_path / "images" / source)
                h, w = int(columns[SIZE_COLUMNS[0]][j]), int(columns[SIZE_COLUMNS[1]][j])
                assert np.array_equal(images[j, :h, :w].numpy(), expected)
                assert not images[j, h:].any() and not images[j, :, w:].any()
                count += 1
        assert count == 8
        assert loader.send_back_to_back()  # what DeviceLoader asks for: the same bytes, in a row
        for images, _, indices, _ in loader:
            sources = ranged.manifest_rows(indices.tolist()).column("source").to_pylist()
            stored = [oracle_pixels(tmp_path / "images" / name).ravel() for name in sources]
            assert images.dim() == 1 and np.array_equal(images.numpy(), np.concatenate(stored))
    assert not list((tmp_path / "bare").rglob("*.npy")), "no shard is downloaded"

    import fsspec  # a changed byte of a sample read: an error naming its shard and row

    fs = fsspec.filesystem("s3", skip_instance_cache=True)  # the store point_at names
    shard = ranged.manifest_rows([3]).column("shard")[0].as_py()
    offset = int(ranged.selection.places[3, 0])  # sample 3's place: (offset, height, width)
    data = bytearray(fs.cat(f"aspect/ds/{shard}"))
    data[128 + offset + 2] ^= 0xFF
    fs.pipe(f"aspect/ds/{shard}", bytes(data))
    fresh = PackedDataset.open(
        "s3://aspect/ds", store=StoreOptions(ranged=True, cache_dir=tmp_path / "bare")
    )
    row = int(fresh.selection.rows[3])
    pattern = rf"{shard}: row {row} does not match the checksum.*repair: etl audit s3://"
    with pytest.raises(ShardError, match=pattern):
        fresh[3]


def test_a_call_stage_that_outgrows_the_bounds_is_a_reject(tmp_path: Path) -> None:
    """After a keep_aspect resize a user function may return another size, within shorter x
    longer; one that returns more is a `bad_output` reject naming the bounds, never a slot
    overrun, and the rest of the run is packed."""
    import os
    import subprocess
    import sys

    write_sources(tmp_path / "images", count=6)
    (tmp_path / "grow.py").write_text(
        "import numpy as np\n"
        "def twice(a):\n"
        "    return np.zeros((4, 41, 3), np.uint8) if a.shape[1] % 2 else a[:-1]\n"
    )
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace("output:", '  - call: {function: "grow:twice"}\noutput:')
    )
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, rows = read_plainly(tmp_path / "out")
    with ipc.open_file(tmp_path / "out/versions/v000001/rejects.arrow") as reader:
        rejects = reader.read_all().to_pylist()
    grown = [r for r in rejects if r["reason"] == "bad_output"]
    bounds = "sides at most 24 (shorter) and 40 (longer)"
    assert grown and all(bounds in r["message"] for r in grown)
    assert len(rows) + len(grown) == 6
    for row in rows:  # the others: one row shorter than Pillow's resize, as the function says
        expected = oracle_pixels(tmp_path / "images" / row["source"])
        assert np.array_equal(row["pixels"], expected[:-1])


def test_a_stream_reads_samples_of_their_own_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`PackedStream` over an aspect-kept dataset: every sample once an epoch, in padded
    batches whose sizes say where each is, and one at a time at its own size."""
    from loaders import PackedStream, stream_loader
    from loaders.read.catalog import open_catalog

    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out")
    pixels = {r["source"]: r["pixels"] for r in rows}
    selection = open_catalog(tmp_path / "out").select()
    sources = open_catalog(tmp_path / "out").table.column("source").to_pylist()
    seen = []
    for workers in (0, 2):
        stream = PackedStream(selection, batch_size=4, window=2)
        for batch in stream_loader(stream, num_workers=workers, pin_memory=False):
            heights, widths = (batch.columns[name] for name in SIZE_COLUMNS)
            for j, index in enumerate(batch.indices.tolist()):
                h, w = int(heights[j]), int(widths[j])
                source = sources[int(selection.positions[index])]
                assert np.array_equal(batch.images[j, :h, :w].numpy(), pixels[source])
                seen.append(index)
    assert sorted(seen) == sorted(list(range(len(selection))) * 2)
    one = PackedStream(selection, batch_size=None, shuffle=False)
    for index, (image, _) in enumerate(one):
        source = sources[int(selection.positions[index])]
        assert np.array_equal(image.numpy(), pixels[source])


def test_a_mixture_joins_samples_of_their_own_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `Mixture` of an aspect-kept dataset and a fixed-size one: padded batches whose sizes
    say where each sample is, each one's pixels its own dataset's."""
    from loaders import Mixture

    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(
        write_config(tmp_path)
        .read_text()
        .replace(f"{{mode: keep_aspect, shorter: 24, longer: {LONGER}}}", "{size: [16, 16]}")
        .replace("dir: out", "dir: fixed")
    )
    assert cli(["run", str(fixed)], capsys)[0] == 0
    members = [PackedDataset.open(tmp_path / "out"), PackedDataset.open(tmp_path / "fixed")]
    mix = Mixture(members, weights=[1, 1])
    seen = 0
    for images, _, indices, columns in make_loader(mix, batch_size=5, seed=2, pin_memory=False):
        heights, widths = (columns[name] for name in SIZE_COLUMNS)
        m = mix.member_of(indices.numpy())
        for j, index in enumerate(indices.tolist()):
            own, _ = members[int(m[j])][index - int(mix.offsets[int(m[j])])]
            h, w = int(heights[j]), int(widths[j])
            assert own.shape[:2] == (h, w)
            assert torch.equal(images[j, :h, :w], own) and not images[j, h:].any()
            seen += 1
    assert seen == len(mix)


def test_the_next_batch_is_advised_by_its_samples_byte_ranges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-ahead of samples of their own size: `prefetch` asks the kernel for exactly each
    sample's bytes (its offset after the 128-byte header, its size), shard by shard."""
    import loaders.read.page_cache

    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out")
    dataset = PackedDataset.open(tmp_path / "out")
    advised: list[tuple[str, str, list[tuple[int, int]]]] = []
    monkeypatch.setattr(
        loaders.read.page_cache,
        "advise_file",
        lambda p, a, r=(): advised.append((str(p), a, list(r))),
    )
    dataset.prefetch([0, 3, 5])
    got = {(path, start, length) for path, _, ranges in advised for start, length in ranges}
    want = set()
    for row in dataset.manifest_rows([0, 3, 5]).to_pylist():
        mine = next(r for r in rows if r["source"] == row["source"])
        path = str(tmp_path / "out" / mine["shard"])
        want.add((path, 128 + mine["sample_offset"], mine["pixels"].size))
    assert got == want and {a for _, a, _ in advised} == {"WILLNEED"}
    dataset.prefetch([len(dataset)])  # out of range: nothing, the gather names it
    assert len(advised) == len({p for p, _, _ in advised})


def _large_aspect_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """An aspect-kept dataset of 12 samples of 200-400 KB in shards of 5 (so a shard's open
    reads few of them), packed by `etl run`; its output folder."""
    rng = np.random.default_rng(7)
    for i in range(12):
        height, width = (int(v) for v in rng.integers(260, 520, size=2))
        folder = tmp_path / "images" / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(f"shorter: {SHORTER}", "shorter: 256"))
    config.write_text(config.read_text().replace(f"longer: {LONGER}", "longer: 512"))
    assert cli(["run", str(config)], capsys)[0] == 0
    return tmp_path / "out"


def _dropped(shards: set[Path]) -> None:
    """Drop the shards from the page cache (skip where the filesystem keeps it, as tmpfs)."""
    from loaders.read.page_cache import advise_file
    from tests.helpers.page_cache import cached_fraction

    for path in shards:
        advise_file(path, "DONTNEED")
    if max(cached_fraction(path) for path in shards) > 0.5:
        pytest.skip("this filesystem keeps its page cache on advice (tmpfs?)")


@pytest.mark.parametrize("readahead", [True, False])
def test_drop_behind_leaves_nothing_of_samples_of_their_own_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], readahead: bool
) -> None:
    """From a cold page cache, a dataset with `drop_behind` reads a batch of samples of their
    own size (each as Pillow's resize of its source says) and releases: the shards' pages are
    gone again but for a few (headers, each shard's probe row read at open), where the kernel's
    readahead would have left megabytes nobody asked for."""
    from tests.helpers.page_cache import cached_pages

    out = _large_aspect_dataset(tmp_path, capsys)
    _, rows = read_plainly(out)
    shards = {out / row["shard"] for row in rows}
    dataset = PackedDataset.open(
        out, readahead=readahead, release_every=1 << 30, drop_behind=True, verify=False
    )
    _dropped(shards)
    batch = [1, 3, 6, 10]
    images, _, _, columns = dataset.__getitems__(batch).batch
    dataset.reader.release()
    left = {path.name: int(cached_pages(path).sum()) for path in shards}
    assert max(left.values()) <= 8, left  # of 250-480 pages a shard
    for j, row in enumerate(dataset.manifest_rows(batch).to_pylist()):  # the oracle reads now
        mine = next(r for r in rows if r["source"] == row["source"])
        h, w = int(columns[SIZE_COLUMNS[0]][j]), int(columns[SIZE_COLUMNS[1]][j])
        assert np.array_equal(images[j, :h, :w].numpy(), mine["pixels"])


@pytest.mark.parametrize("readahead", [True, False])
def test_a_cold_batch_gathered_in_a_worker_is_read_ahead_by_its_samples_ranges(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    readahead: bool,
) -> None:
    """A gather (as a DataLoader worker makes, with no prefetch before it) whose samples are
    not in the page cache first asks the kernel for exactly each sample's byte range, all at
    once; the same batch again, now cached, asks for nothing (a probe of a few pages); with
    `readahead=False` nothing is asked. The batch holds the packed pixels each time."""
    import loaders.read.page_cache

    _, rows = read_plainly(_large_aspect_dataset(tmp_path, capsys))
    dataset = PackedDataset.open(tmp_path / "out", readahead=readahead, verify=False)
    _dropped({tmp_path / "out" / row["shard"] for row in rows})
    advised: list[tuple[str, int, int]] = []
    real = loaders.read.page_cache.advise_file

    def recording(path: Path, advice: str, ranges: object = ((0, 0),)) -> None:
        ranges = list(ranges)  # type: ignore[call-overload]
        advised.extend((str(path), start, length) for start, length in ranges)
        real(path, advice, ranges)

    monkeypatch.setattr(loaders.read.page_cache, "advise_file", recording)
    batch = [0, 4, 7, len(dataset) - 1]
    mine = [
        next(r for r in rows if r["source"] == row["source"])
        for row in dataset.manifest_rows(batch).to_pylist()
    ]
    want = {
        (str(tmp_path / "out" / row["shard"]), 128 + row["sample_offset"], row["pixels"].size)
        for row in mine
    }
    for _ in range(2):
        images, _, _, columns = dataset.__getitems__(batch).batch
        for j, row in enumerate(mine):
            h, w = int(columns[SIZE_COLUMNS[0]][j]), int(columns[SIZE_COLUMNS[1]][j])
            assert np.array_equal(images[j, :h, :w].numpy(), row["pixels"])
        assert set(advised) == (want if readahead else set())
        advised.clear()
        want = set()  # cached now: the probe finds the batch, nothing is asked


@pytest.mark.parametrize("workers", [0, 2])
def test_a_changed_byte_of_a_sample_is_named_by_the_default_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    """Each sample of its own size is checked against its checksum the first time it is read
    (the default): the intact ones come as Pillow says, a flipped byte in one is an error
    naming its shard and row, and `verify=False` hands it out unchecked."""
    from etl.errors import ShardError

    write_sources(tmp_path / "images")
    assert cli(["run", str(write_config(tmp_path))], capsys)[0] == 0
    _, rows = read_plainly(tmp_path / "out")
    victim = rows[len(rows) // 2]
    path = tmp_path / "out" / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + 1] ^= 0xFF
    path.write_bytes(bytes(data))
    dataset = PackedDataset.open(tmp_path / "out")
    sources = dataset.manifest_rows(range(len(dataset))).column("source").to_pylist()
    row = int(dataset.selection.rows[sources.index(victim["source"])])
    loader = make_loader(
        dataset, batch_size=4, num_workers=workers, workers_as="processes", pin_memory=False
    )
    pattern = rf"{path.name}: row {row} does not match the checksum"
    with pytest.raises(ShardError, match=pattern):
        list(loader)
    unchecked = PackedDataset.open(tmp_path / "out", verify=False)
    for i in range(len(unchecked)):
        source = unchecked.manifest_rows([i]).column("source")[0].as_py()
        same = np.array_equal(unchecked[i][0].numpy(), oracle_pixels(tmp_path / "images" / source))
        assert same == (source != victim["source"])
