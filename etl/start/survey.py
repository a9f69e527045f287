"""What `etl init` learns of a class-per-folder tree before it writes a config: the folder
listed as `etl run` would list it (`etl.sources.kinds.folder.list_folder`, default patterns),
and the headers of a sample of its images (sizes after EXIF orientation, colour modes), never
their pixels.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from etl.config import FolderSource
from etl.errors import SourceError
from etl.sources.kinds.folder import list_folder

SIZES = (32, 64, 96, 128, 160, 224, 256)
"""Square sizes `etl init` suggests: the largest at or below the median shorter source side."""

GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N"})
_SWAPS_AXES = frozenset({5, 6, 7, 8})


def suggest_size(shorter_side: float) -> int:
    """The largest of SIZES not above `shorter_side` (so samples are rarely upscaled); the
    smallest when every size is above it."""
    below = [s for s in SIZES if s <= shorter_side]
    return below[-1] if below else SIZES[0]


@dataclass(frozen=True)
class Survey:
    """What `etl init` found under a source folder."""

    root: Path
    classes: dict[str, int]
    """Images per class folder, by sorted name (the label order `etl run` uses)."""
    outside: int
    """Files `etl run` would reject while listing: outside any class folder, links out of root."""
    sampled: int
    """Images whose header was read for the size statistics."""
    unreadable: int
    """Sampled files whose header Pillow could not read (`etl run` will reject them)."""
    median_hw: tuple[int, int] | None
    """Median (height, width) of the readable sampled images, after EXIF orientation."""
    median_shorter: float | None
    grey: bool
    """Every readable sampled image is greyscale."""

    @property
    def images(self) -> int:
        return sum(self.classes.values())

    @property
    def size(self) -> int:
        """The suggested square output size."""
        return suggest_size(self.median_shorter) if self.median_shorter else SIZES[1]


def survey(root: Path | str, sample: int = 200) -> Survey:
    """List `root` as a folder source and read the headers of up to `sample` images, spread
    evenly over the sorted listing (deterministic)."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder; expected one sub-folder of images per class")
    listing = list_folder(FolderSource(path=root))
    if not listing.files:
        raise SourceError(
            f"{root}: no images inside class folders (expected {root.name}/<class>/<image>, "
            f"with names matching {', '.join(FolderSource.model_fields['include'].default)})"
        )
    classes: dict[str, int] = {}
    for f in listing.files:
        assert f.class_name is not None
        classes[f.class_name] = classes.get(f.class_name, 0) + 1
    n = len(listing.files)
    picks = sorted({round(i * (n - 1) / max(1, min(sample, n) - 1)) for i in range(min(sample, n))})
    sizes: list[tuple[int, int]] = []
    grey = True
    for i in picks:
        header = _header(listing.files[i].path)
        if header is not None:
            sizes.append(header[0])
            grey &= header[1] in GREY_MODES
    shorter = statistics.median(min(hw) for hw in sizes) if sizes else None
    median_hw = (
        (
            round(statistics.median(h for h, _ in sizes)),
            round(statistics.median(w for _, w in sizes)),
        )
        if sizes
        else None
    )
    return Survey(
        root=root,
        classes=dict(sorted(classes.items())),
        outside=len(listing.rejects),
        sampled=len(picks),
        unreadable=len(picks) - len(sizes),
        median_hw=median_hw,
        median_shorter=shorter,
        grey=grey and bool(sizes),
    )


def _header(path: str) -> tuple[tuple[int, int], str] | None:
    """((height, width) after EXIF orientation, mode) from the file's header; None if unreadable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a decompression-bomb warning: we read no pixels
            with Image.open(path) as image:
                width, height = image.size
                if image.getexif().get(0x0112) in _SWAPS_AXES:
                    width, height = height, width
                return (height, width), image.mode
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError):
        return None
