"""The sample dataset is deterministic, messy in the documented ways, and learnable by shape."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from etl.start.sample_data import CLASSES, SampleDataReport, make_sample_data

PER_CLASS = 6
BROKEN_NAMES = {
    "broken_truncated_half.jpg",
    "broken_truncated_half.png",
    "broken_zero_bytes.jpg",
    "broken_text_not_image.jpg",
    "broken_bad_crc.png",
}
EDGE_PREFIXES = ("broken_", "edge_")
SEED_INDEPENDENT = {"broken_zero_bytes.jpg", "broken_text_not_image.jpg", ".DS_Store"}


def _hashes(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root, hidden files included."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _images(root: Path) -> Iterator[Path]:
    """The ordinary (non edge-case) images, sorted."""
    for name in CLASSES:
        yield from sorted(p for p in (root / name).iterdir() if p.name.startswith(f"{name}_"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SampleDataReport]:
    root = tmp_path_factory.mktemp("sample") / "data"
    return root, make_sample_data(root, per_class=PER_CLASS, seed=0)


@pytest.fixture(autouse=True)
def _strict_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncated files must fail to load, whatever another test module set globally."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)


def test_same_seed_gives_identical_bytes_and_other_seed_differs(
    sample: tuple[Path, SampleDataReport], tmp_path: Path
) -> None:
    root, _ = sample
    again = make_sample_data(tmp_path / "again", per_class=PER_CLASS, seed=0)
    other = make_sample_data(tmp_path / "other", per_class=PER_CLASS, seed=1)
    first = _hashes(root)
    assert _hashes(again.root) == first
    fixed = {digest for name, digest in first.items() if Path(name).name in SEED_INDEPENDENT}
    assert set(first.values()) & set(_hashes(other.root).values()) == fixed


def test_an_image_does_not_depend_on_per_class(
    sample: tuple[Path, SampleDataReport], tmp_path: Path
) -> None:
    """Seeding per (seed, class, i) means a smaller run is a prefix of a larger one."""
    root, _ = sample
    small = make_sample_data(tmp_path / "small", per_class=2, broken=False)
    small_hashes = _hashes(small.root)
    assert small_hashes
    big_hashes = _hashes(root)
    assert all(big_hashes[name] == digest for name, digest in small_hashes.items())


def test_layout_and_report_match_the_files_on_disk(sample: tuple[Path, SampleDataReport]) -> None:
    root, report = sample
    assert report.root == root
    assert sorted(p.name for p in root.iterdir()) == sorted(CLASSES)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) == report.images + report.broken
    for name in CLASSES:
        ordinary = [p for p in (root / name).iterdir() if p.name.startswith(f"{name}_")]
        assert len(ordinary) == report.per_class[name] == PER_CLASS
    assert report.images == PER_CLASS * len(CLASSES)
    assert 8 <= report.broken <= 12
    # The edge files are spread over the classes, and no stray temporary folder is left.
    edge_classes = {p.parent.name for p in files if p.name.startswith(EDGE_PREFIXES)}
    assert len(edge_classes) >= 4
    assert [p.name for p in root.parent.iterdir()] == [root.name]


def test_without_broken_only_valid_images_are_written(tmp_path: Path) -> None:
    calls: list[int] = []
    report = make_sample_data(tmp_path / "d", per_class=2, broken=False, progress=calls.append)
    files = [p for p in report.root.rglob("*") if p.is_file()]
    assert report.broken == 0
    assert len(files) == report.images == 2 * len(CLASSES) == sum(calls)
    for p in files:
        with Image.open(p) as im:
            im.load()


def test_progress_counts_every_image(tmp_path: Path) -> None:
    calls: list[int] = []
    report = make_sample_data(tmp_path / "d", per_class=1, progress=calls.append)
    assert sum(calls) == report.images == len(CLASSES), "the bar's total is per_class x classes"
    assert all(n > 0 for n in calls)


def test_formats_modes_sizes_and_orientation_vary(sample: tuple[Path, SampleDataReport]) -> None:
    root, _ = sample
    formats, modes, sizes, aspects, suffixes = set(), set(), set(), [], set()
    orientations: dict[Path, int] = {}
    for path in _images(root):
        suffixes.add(path.suffix)
        with Image.open(path) as im:
            im.load()
            formats.add(im.format)
            modes.add(im.mode)
            orientation = im.getexif().get(0x0112)
            if orientation in (6, 8):
                orientations[path] = orientation
            upright = ImageOps.exif_transpose(im)
            sizes.add(upright.size)
            aspects.append(upright.width / upright.height)
    assert {"JPEG", "PNG"} <= formats
    assert {"RGB", "L", "RGBA", "P", "CMYK", "1"} <= modes
    assert modes & {"I;16", "I"}
    assert orientations
    assert len(sizes) >= len(CLASSES) * PER_CLASS // 2
    assert min(aspects) < 0.8 and max(aspects) > 1.25
    assert {".jpg", ".png"} <= suffixes and len(suffixes) >= 3
    assert all(min(size) >= 48 and max(size) <= 480 for size in sizes)


def test_exif_rotated_image_is_upright_after_applying_orientation(
    sample: tuple[Path, SampleDataReport],
) -> None:
    """Stored pixels are turned; after exif_transpose the stripes run the way the class says."""
    root, _ = sample
    checked = 0
    for name, axis in (("hstripes", 0), ("vstripes", 1)):
        for path in _images(root):
            with Image.open(path) as im:
                if path.parent.name != name or im.getexif().get(0x0112) not in (6, 8):
                    continue
                stored = _grey(im)
                upright = _grey(ImageOps.exif_transpose(im))
            # Horizontal stripes change along y (axis 0): the gradient across them dominates.
            assert _gradient_energy(upright, axis) > 2 * _gradient_energy(upright, 1 - axis)
            assert _gradient_energy(stored, 1 - axis) > 2 * _gradient_energy(stored, axis)
            checked += 1
    assert checked >= 1


def test_sixteen_bit_image_spans_the_full_range(sample: tuple[Path, SampleDataReport]) -> None:
    root, _ = sample
    found = 0
    for path in _images(root):
        with Image.open(path) as im:
            if im.mode in ("I;16", "I"):
                pixels = np.asarray(im)
                assert pixels.min() == 0 and pixels.max() == 65535
                found += 1
    assert found


def test_rgba_image_has_a_transparent_background(sample: tuple[Path, SampleDataReport]) -> None:
    root, _ = sample
    found = 0
    for path in _images(root):
        with Image.open(path) as im:
            if im.mode == "RGBA":
                alpha = np.asarray(im)[:, :, 3]
                assert alpha.min() == 0 and alpha.max() == 255
                found += 1
    assert found


def test_broken_files_really_are_broken(sample: tuple[Path, SampleDataReport]) -> None:
    root, _ = sample
    by_name = {p.name: p for p in root.rglob("*") if p.is_file()}
    assert set(by_name) >= BROKEN_NAMES
    assert by_name["broken_zero_bytes.jpg"].stat().st_size == 0
    for name in BROKEN_NAMES:
        with pytest.raises((OSError, SyntaxError, EOFError)), Image.open(by_name[name]) as im:
            im.load()
    # Even a lenient decoder refuses the bad CRC: IHDR is a critical chunk.
    ImageFile.LOAD_TRUNCATED_IMAGES = True  # undone by the _strict_pillow fixture
    with pytest.raises(UnidentifiedImageError):
        Image.open(by_name["broken_bad_crc.png"])
    # The truncated files are cut-off valid files: their headers still parse.
    for name in ("broken_truncated_half.jpg", "broken_truncated_half.png"):
        with Image.open(by_name[name]) as im:
            assert im.size == (160, 120)


def test_edge_files_are_valid_but_unusual(sample: tuple[Path, SampleDataReport]) -> None:
    root, _ = sample
    by_name = {p.name: p for p in root.rglob("*") if p.is_file()}
    with Image.open(by_name["edge_too_small_12x10.png"]) as im:
        assert im.size == (12, 10)
    with Image.open(by_name["edge_extreme_aspect_400x20.jpg"]) as im:
        im.load()
        assert im.size == (400, 20)
    with Image.open(by_name["edge_animated_3frames.gif"]) as im:
        assert im.format == "GIF" and getattr(im, "n_frames", 1) == 3
        frames = []
        for k in range(3):
            im.seek(k)
            frames.append(np.asarray(im.convert("RGB")))
        assert not np.array_equal(frames[0], frames[1])
    assert (by_name[".DS_Store"]).parent.name in CLASSES

    duplicates = [p for p in by_name.values() if p.name.startswith("edge_duplicate_of_")]
    assert len(duplicates) == 1
    duplicate = duplicates[0]
    original = duplicate.parent / duplicate.name.removeprefix("edge_duplicate_of_")
    assert original.exists() and original != duplicate
    assert original.read_bytes() == duplicate.read_bytes()


def test_existing_non_empty_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        make_sample_data(root, per_class=1)
    assert [p.name for p in root.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no partial folder left behind


def test_existing_empty_root_is_filled(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    report = make_sample_data(root, per_class=1, broken=False)
    assert report.images == len(CLASSES)
    assert sorted(p.name for p in root.iterdir()) == sorted(CLASSES)


def test_failure_midway_leaves_neither_root_nor_partial(tmp_path: Path) -> None:
    def explode(n: int) -> None:
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        make_sample_data(tmp_path / "data", per_class=1, progress=explode)
    assert list(tmp_path.iterdir()) == []


def test_per_class_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="per_class"):
        make_sample_data(tmp_path / "data", per_class=0)


# -- learnability ----------------------------------------------------------------------------------


def _grey(im: Image.Image) -> NDArray[np.float32]:
    """Luminance in 0..255 as float32, whatever the mode (16-bit is scaled, not clipped)."""
    if im.mode in ("I;16", "I"):
        return (np.asarray(im, dtype=np.float32) / 257).astype(np.float32)
    return np.asarray(im.convert("RGB").convert("L"), dtype=np.float32)


def _gradient_energy(grey: NDArray[np.float32], axis: int) -> float:
    """Mean squared derivative along `axis` after 4x4 box averaging (which mutes pixel noise)."""
    h, w = (grey.shape[0] // 4) * 4, (grey.shape[1] // 4) * 4
    small = grey[:h, :w].reshape(h // 4, 4, w // 4, 4).mean(axis=(1, 3))
    return float((np.gradient(small, axis=axis) ** 2).mean())


def _edge_features(path: Path) -> NDArray[np.float64]:
    """Centre crop -> 64x64 grey -> |d/dx| and |d/dy| pooled to 16x16 each, L2-normalised.

    NOTE: the two gradient components are kept apart because the gradient magnitude alone
    discards orientation, which is exactly what separates horizontal from vertical stripes.
    """
    with Image.open(path) as im:
        grey = _grey(ImageOps.exif_transpose(im))
    h, w = grey.shape
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    crop = Image.fromarray(grey[top : top + s, left : left + s]).resize(
        (64, 64), Image.Resampling.BILINEAR
    )
    gy, gx = np.gradient(np.asarray(crop, dtype=np.float64))

    def pool(m: NDArray[np.float64]) -> NDArray[np.float64]:
        return m.reshape(16, 4, 16, 4).mean(axis=(1, 3))

    features = np.concatenate([pool(np.abs(gx)).ravel(), pool(np.abs(gy)).ravel()])
    return features / (np.linalg.norm(features) + 1e-12)


def test_classes_differ_in_structure_nearest_centroid(tmp_path: Path) -> None:
    """A nearest-centroid classifier on edge maps, trained on 20 images per class and scored on
    10 held-out ones, must beat chance (1/6) by a wide margin: the shape carries the class."""
    train, test = 20, 10
    report = make_sample_data(tmp_path / "data", per_class=train + test, seed=7, broken=False)
    features = {
        name: np.stack([_edge_features(p) for p in _images(report.root) if p.parent.name == name])
        for name in CLASSES
    }
    centroids = np.stack([features[name][:train].mean(axis=0) for name in CLASSES])
    correct = 0
    for k, name in enumerate(CLASSES):
        held_out = features[name][train:]
        distances = ((held_out[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        correct += int((distances.argmin(axis=1) == k).sum())
    accuracy = correct / (test * len(CLASSES))
    assert accuracy > 0.6, f"nearest-centroid accuracy {accuracy:.2f}"


def test_encoded_sizes_are_plausible(sample: tuple[Path, SampleDataReport]) -> None:
    """Guards against silently writing empty or raw images: every image decodes to its size."""
    root, _ = sample
    for path in _images(root):
        data = path.read_bytes()
        assert len(data) > 100
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            assert min(im.size) >= 48


def test_a_folder_that_cannot_be_made_there_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl sample-data` under a file (no folder can be made there): exit code 2 and one line
    naming the folder, never a NotADirectoryError's traceback, nothing left behind."""
    from tests.helpers.cli import cli

    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    code, _, err = cli(["sample-data", str(blocker / "data"), "--per-class", "1", "-q"], capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(blocker / "data") in err
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
