"""Look at a packed dataset: the manifest as a table, samples as images, summaries and pictures.

    import etl.explore.view as ex
    ds = ex.open_dataset("artifacts")          # the latest version; version=N pins one
    ds.table                                   # the manifest, an Arrow table
    ds.to_pandas()                             # the same as a pandas DataFrame
    ds.image("3f2a9c0d1e4b5a67")               # a sample as a PIL image, by sample_id or position
    ds.counts()                                # {split: {class: samples}}
    ds.contact_sheet(n=16, classes=["circle"]) # a Sheet; shows itself in a notebook
    ds.class_balance()                         # a Chart of samples per class and split

Everything here returns data, PIL images or small dataclasses that hold them; nothing prints or
writes files (the CLI, `etl inspect` and `etl show`, saves them). Pictures are drawn with Pillow
alone: no plotting library is needed. Shards are opened through
`etl.format.shards.open_shard`, which
checks each file against the manifest, and are read through read-only memmaps.
"""

from __future__ import annotations

import io
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

from etl.errors import EtlError
from etl.format import names
from etl.format.manifest import Manifest, list_versions, read_manifest
from etl.format.shards import open_shard
from etl.sources import readers

if TYPE_CHECKING:
    from etl.config import (
        DecodeStage,
    )  # NOTE: pydantic costs 0.25 s to import; only rejects need it

SampleKey: TypeAlias = "int | str"
"""A sample by its `sample_id` (a str) or its position in the manifest (an int; -1 is the last)."""

SPLIT_ORDER = ("train", "val", "test")
"""Splits are listed in this order, then any others by name."""


def ordered_splits(splits: Sequence[str]) -> list[str]:
    known = [s for s in SPLIT_ORDER if s in splits]
    return known + sorted(set(splits) - set(known))


# --- the dataset ------------------------------------------------------------------------------


def open_dataset(path: Path | str, version: int | None = None) -> Dataset:
    """Open a dataset folder, a version folder or a manifest.arrow file, read-only.

    The latest version unless `version` pins one; `ManifestError` if there is none or the
    manifest is not coherent (an unknown format version, a shard path outside the dataset, ...).
    """
    return Dataset(read_manifest(path, version))


class Dataset:
    """One committed version of a packed dataset, for looking at: tables, arrays, images.

    Shards are opened on first use and kept open (read-only memmaps cost no memory until read).
    """

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._shards: dict[str, np.memmap] = {}

    # -- what it is ----------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.manifest.root

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def versions(self) -> list[int]:
        """Every committed version of this dataset, oldest first."""
        return list_versions(self.root)

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; label `i` is `classes[i]`."""
        return self.manifest.meta.classes

    @property
    def layout(self) -> str:
        """'HWC' or 'CHW': the axis order of stored samples and of `array()`."""
        return self.manifest.meta.layout

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.manifest.meta.sample_shape

    @property
    def table(self) -> pa.Table:
        """The manifest: one row per sample, sorted by `source` (columns: docs/FORMAT.md)."""
        return self.manifest.samples

    @property
    def rejects(self) -> pa.Table:
        """One row per listed source that was not packed: source, reason, message, ..."""
        return self.manifest.rejects

    @property
    def shards(self) -> pa.Table:
        """One row per shard this version references: shard, rows, bytes, checksums."""
        return self.manifest.shards

    @property
    def splits(self) -> list[str]:
        return ordered_splits(pc.unique(self.table.column("split")).to_pylist())

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.sample_shape)
        return (
            f"<Dataset {str(self.root)!r} version {self.version}: {len(self)} samples, "
            f"{len(self.classes)} classes, {shape} {self.layout}, "
            f"{self.rejects.num_rows} rejects>"
        )

    def to_pandas(self, rejects: bool = False) -> Any:
        """The manifest (or with `rejects=True` the rejects table) as a pandas DataFrame."""
        table = self.rejects if rejects else self.table
        try:
            return table.to_pandas()
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"to_pandas() needs pandas ({exc}); pip install pandas, or use .table (Arrow)"
            ) from None

    # -- one sample ----------------------------------------------------------------------------

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.table.column("sample_id").to_pylist())}

    def position(self, key: SampleKey) -> int:
        """Row of a sample in `table`, from its sample_id or a (possibly negative) position."""
        if isinstance(key, str):
            found = self._positions.get(key)
            if found is None:
                raise EtlError(f"{self.manifest.path}: no sample with sample_id {key!r}")
            return found
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise TypeError(f"a sample is a sample_id (str) or a position (int), not {key!r}")
        n = len(self)
        if not -n <= int(key) < n:
            raise IndexError(f"position {key} is outside the {n} samples of version {self.version}")
        return int(key) % n

    def row(self, key: SampleKey) -> dict[str, Any]:
        """The manifest row of one sample as a dict."""
        row: dict[str, Any] = self.table.slice(self.position(key), 1).to_pylist()[0]
        return row

    def array(self, key: SampleKey) -> NDArray[np.uint8]:
        """The stored pixels of one sample, read-only, in the stored layout (`sample_shape`)."""
        row = self.row(key)
        return np.asarray(self._shard(row["shard"])[row["row"]])

    def image(self, key: SampleKey) -> Image.Image:
        """One sample as a PIL image: RGB, or L for one channel; CHW is transposed for display."""
        return to_image(self.array(key), self.layout)

    def _shard(self, name: str) -> np.memmap:
        if name not in self._shards:
            rows = self.shards.filter(pc.field("shard") == name).column("rows").to_pylist()
            self._shards[name] = open_shard(
                self.manifest.shard_path(name), self.sample_shape, rows[0]
            )
        return self._shards[name]

    # -- summaries -----------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[str, int]]:
        """Samples per split and class: {split: {class: n}}, every class listed (zeros too)."""
        grouped = self.table.group_by(["split", "label"]).aggregate([("sample_id", "count")])
        out = {split: dict.fromkeys(self.classes, 0) for split in self.splits}
        for split, label, n in zip(
            grouped.column("split").to_pylist(),
            grouped.column("label").to_pylist(),
            grouped.column("sample_id_count").to_pylist(),
            strict=True,
        ):
            out[split][self.classes[label]] = int(n)
        return out

    def summary(self) -> Summary:
        """What `etl inspect` shows: counts, shards, versions, rejects and the output config."""
        meta = self.manifest.meta
        reasons = Counter(self.rejects.column("reason").to_pylist())
        return Summary(
            root=str(self.root),
            version=self.version,
            versions=self.versions,
            created=meta.created,
            tool_version=meta.tool_version,
            format_version=meta.format_version,
            samples=len(self),
            classes=list(self.classes),
            splits=self.splits,
            counts=self.counts(),
            shards=self.shards.num_rows,
            shard_bytes=int(pc.sum(self.shards.column("bytes")).as_py() or 0),
            rejects=self.rejects.num_rows,
            rejects_by_reason=dict(sorted(reasons.items())),
            checksum=meta.checksum,
            layout=meta.layout,
            sample_shape=list(meta.sample_shape),
            dtype=meta.dtype,
            config_digest=meta.config_digest,
            config=dict(meta.config),
        )

    # -- choosing and drawing ------------------------------------------------------------------

    def pick(
        self,
        n: int = 16,
        seed: int = 0,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[int]:
        """Positions of samples to show. `ids`: exactly those, in that order. Otherwise up to `n`
        drawn at random (a pure function of `seed`) from those in `split` and `classes`, in
        manifest order. An unknown split, class or id is an error naming the valid ones."""
        if ids is not None:
            if split is not None or classes is not None:
                raise ValueError("choose samples by ids, or by split and classes, not both")
            return [self.position(sid) for sid in ids]
        mask = np.ones(len(self), dtype=bool)
        if split is not None:
            wanted = [split] if isinstance(split, str) else list(split)
            unknown = sorted(set(wanted) - set(self.splits))
            if unknown:
                raise EtlError(
                    f"no split {unknown} in version {self.version}; splits: {self.splits}"
                )
            mask &= _bool(pc.is_in(self.table.column("split"), pa.array(wanted, pa.string())))
        if classes is not None:
            unknown = sorted(set(classes) - set(self.classes))
            if unknown:
                raise EtlError(f"no class {unknown}; classes: {list(self.classes)}")
            labels = [self.classes.index(c) for c in classes]
            mask &= np.isin(self.table.column("label").to_numpy(), labels)
        candidates = np.flatnonzero(mask)
        if len(candidates) == 0:
            raise EtlError(f"no sample of version {self.version} matches split and classes")
        rng = np.random.default_rng(seed)
        chosen = rng.choice(candidates, size=min(n, len(candidates)), replace=False)
        return sorted(int(p) for p in chosen)

    def contact_sheet(
        self,
        n: int = 16,
        seed: int = 0,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
        columns: int | None = None,
        cell: int = 128,
    ) -> Sheet:
        """Samples chosen by `pick`, each captioned with its class, split and sample id."""
        positions = self.pick(n, seed, split, classes, ids)
        rows = self.table.take(positions).to_pylist()
        cells = [
            Cell(
                image=self.image(p),
                caption=(f"{r['class_name']} ({r['split']})", r["sample_id"]),
                info={
                    "position": p,
                    "sample_id": r["sample_id"],
                    "class_name": r["class_name"],
                    "split": r["split"],
                    "source": r["source"],
                },
            )
            for p, r in zip(positions, rows, strict=True)
        ]
        title = f"{self.root.name} v{self.version}: {len(cells)} of {len(self)} samples"
        return draw_sheet(cells, columns=columns, cell=cell, title=title)

    def reject_sheet(
        self,
        source_root: Path | str,
        decode: DecodeStage | None = None,
        n: int = 16,
        seed: int = 0,
        reasons: Sequence[str] | None = None,
        columns: int | None = None,
        cell: int = 128,
    ) -> Sheet:
        """Thumbnails of rejected sources read from `source_root`, captioned with the reason.

        A source is decoded as the pipeline does (`decode`: the config's decode stage, default
        RGB), so decompression bombs stay refused; one that cannot be read or decoded, or that
        lies outside `source_root`, gets a placeholder cell saying why. Up to `n` rejects drawn
        at random by `seed`, in source order; `reasons` keeps only those reasons.
        """
        table = self.rejects
        if reasons is not None:
            known = set(table.column("reason").to_pylist())
            unknown = sorted(set(reasons) - known)
            if unknown:
                raise EtlError(f"no reject with reason {unknown}; reasons: {sorted(known)}")
            table = table.filter(pc.is_in(table.column("reason"), pa.array(list(reasons))))
        if table.num_rows == 0:
            raise EtlError(f"version {self.version} has no rejects to show")
        rng = np.random.default_rng(seed)
        take = rng.choice(table.num_rows, size=min(n, table.num_rows), replace=False)
        rows = table.take(sorted(int(i) for i in take)).to_pylist()
        if decode is None:
            from etl.config import DecodeStage

            decode = DecodeStage()
        cells = [reject_cell(Path(source_root), r, decode) for r in rows]
        title = f"{self.root.name} v{self.version}: {len(cells)} of {self.rejects.num_rows} rejects"
        return draw_sheet(cells, columns=columns, cell=cell, title=title)

    def class_balance(self) -> Chart:
        """A grouped bar chart of samples per class, one bar per split."""
        title = f"{self.root.name} v{self.version}: {len(self)} samples per class and split"
        return draw_class_balance(self.counts(), self.classes, title)


def to_image(array: NDArray[np.uint8], layout: str) -> Image.Image:
    """A stored sample -> PIL image: CHW is transposed to HWC; one channel becomes mode L."""
    if array.ndim != 3 or layout not in ("HWC", "CHW"):
        raise ValueError(f"expected a 3-d {layout} sample, got shape {array.shape}")
    hwc = array.transpose(1, 2, 0) if layout == "CHW" else array
    if hwc.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(hwc[:, :, 0]))
    if hwc.shape[2] == 3:
        return Image.fromarray(np.ascontiguousarray(hwc))
    raise ValueError(f"cannot show a sample with {hwc.shape[2]} channels")


def _bool(result: pa.ChunkedArray | pa.Array) -> NDArray[np.bool_]:
    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(frozen=True)
class Summary:
    """One version of a dataset in numbers; `to_dict()` is `etl inspect --json`."""

    root: str
    version: int
    versions: list[int]
    created: str
    tool_version: str
    format_version: int
    samples: int
    classes: list[str]
    splits: list[str]
    counts: dict[str, dict[str, int]]
    """{split: {class: samples}}"""
    shards: int
    shard_bytes: int
    """Bytes of the shard files this version references, headers included."""
    rejects: int
    rejects_by_reason: dict[str, int]
    checksum: str
    layout: str
    sample_shape: list[int]
    dtype: str
    config_digest: str
    config: dict[str, Any]
    """The output-shaping config (stages, layout, checksum, split) the version was packed with."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


# --- rejected sources -------------------------------------------------------------------------

MAX_REJECT_BYTES = 256 << 20
"""A rejected file larger than this is not read for its thumbnail (a placeholder says so)."""


def reject_cell(source_root: Path, reject: Mapping[str, Any], decode: DecodeStage) -> Cell:
    """The cell of one row of rejects.arrow: its thumbnail, or a placeholder saying why not."""
    from etl.images.rejects import Reject
    from etl.images.stages import decode as decode_image

    source, reason = str(reject["source"]), str(reject["reason"])
    info = {"source": source, "reason": reason, "message": reject["message"], "decoded": False}
    caption = (reason, PurePosixPath(source).name)
    try:
        data = _read_inside(source_root, source)
        image = decode_image(data, decode).image
    except (OSError, _Outside) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Cell(None, caption, {**info, "note": why}, placeholder=f"{reason}: {why}")
    except Reject as exc:
        return Cell(None, caption, {**info, "note": str(exc)}, placeholder=str(exc))
    return Cell(image, caption, {**info, "decoded": True})


class _Outside(Exception):
    pass


def _read_inside(root: Path, source: str) -> bytes:
    """Bytes of the file `source` names under `root`, refusing paths (or links) that lead
    outside `root`, anything but a regular file (never opened: reading a FIFO would block) and
    files above MAX_REJECT_BYTES."""
    try:
        path = names.source_path(root, source)
    except ValueError:
        raise _Outside("path outside the source root") from None
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise _Outside("link leads outside the source root")
    kind = readers.not_a_file(os.stat(path))
    if kind is not None:
        raise _Outside(f"{kind}, not a regular file")
    try:
        return readers.read_regular_file(path, MAX_REJECT_BYTES)
    except readers.Refused as exc:
        raise _Outside(str(exc)) from None


# --- drawing: shared ----------------------------------------------------------------------------

Font: TypeAlias = "ImageFont.FreeTypeFont | ImageFont.ImageFont"
INK = (20, 20, 20)
PAPER = (250, 250, 250)
MUTED = (110, 110, 110)
FRAME = (190, 190, 190)


def font(size: int) -> Font:
    """Pillow's bundled font (FreeType when Pillow has it, else its bitmap font)."""
    return ImageFont.load_default(size=size)


def _line_height(f: Font) -> int:
    return int(f.getbbox("Ag|")[3]) + 3


def _text_width(f: Font, text: str) -> float:
    return float(f.getlength(text))


def _printable(f: Font, text: str) -> str:
    """Control characters shown as '?'; the bitmap font only has latin-1."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    if not isinstance(f, ImageFont.FreeTypeFont):
        text = text.encode("latin-1", "replace").decode("latin-1")
    return text


def fit_text(f: Font, text: str, width: float) -> str:
    """`text`, cut with '...' at the end so that it is at most `width` pixels wide."""
    text = _printable(f, text)
    if _text_width(f, text) <= width:
        return text
    while text and _text_width(f, text + "...") > width:
        text = text[:-1]
    return text + "..."


def _wrap(f: Font, text: str, width: float, max_lines: int) -> list[str]:
    words, lines = _printable(f, text).split(), [""]
    for word in words:
        trial = f"{lines[-1]} {word}".strip()
        if _text_width(f, trial) <= width or not lines[-1]:
            lines[-1] = trial
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], " ".join(lines[max_lines - 1 :])]
    return [fit_text(f, line, width) for line in lines]


class _Picture:
    """Shared by Sheet and Chart: Jupyter shows either inline through `_repr_png_`."""

    image: Image.Image

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.image.save(buffer, format="PNG")
        return buffer.getvalue()


# --- drawing: contact sheets --------------------------------------------------------------------

Box: TypeAlias = tuple[int, int, int, int]
"""(left, top, right, bottom) in pixels, right and bottom exclusive, as PIL crops take it."""


@dataclass(frozen=True)
class Cell:
    """One tile of a contact sheet: an image (None draws a placeholder) and caption lines."""

    image: Image.Image | None
    caption: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)
    """What the cell shows, for scripts (`etl show --json`): sample id, class, source, ..."""
    placeholder: str = ""
    """Text inside a placeholder cell, e.g. why the image cannot be shown."""


@dataclass(frozen=True)
class Sheet(_Picture):
    """A drawn contact sheet and where each cell's image landed on it."""

    image: Image.Image
    boxes: tuple[Box, ...]
    """Cell i's picture: exactly `thumbnail(cells[i].image, cell)`, pasted at boxes[i]."""
    info: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": list(self.image.size),
            "cells": [
                {**info, "box": list(box)} for info, box in zip(self.info, self.boxes, strict=True)
            ],
        }


def thumbnail(image: Image.Image, cell: int) -> Image.Image:
    """Fit `image` into a `cell` x `cell` square. Smaller images grow by the largest whole factor
    with NEAREST, so every stored pixel stays a crisp block (a 64x64 sample becomes 128x128 in a
    128 px cell); larger ones shrink with BOX (an average over each output pixel)."""
    width, height = image.size
    if width <= cell and height <= cell:
        factor = max(1, min(cell // width, cell // height))
        if factor == 1:
            return image
        return image.resize((width * factor, height * factor), Image.Resampling.NEAREST)
    # NOTE: not ImageOps.contain, which makes a 1x32 image 0 px wide in a 16 px cell.
    scale = cell / max(width, height)
    size = (max(1, min(cell, round(width * scale))), max(1, min(cell, round(height * scale))))
    return image.resize(size, Image.Resampling.BOX)


PAD = 8


def draw_sheet(
    cells: Sequence[Cell], columns: int | None = None, cell: int = 128, title: str = ""
) -> Sheet:
    """Tile `cells` row by row, `columns` per row (default: a square-ish grid of at most 8).

    Deterministic layout: slot i is at column i % columns, row i // columns; each slot is a
    `cell` px square for the image (centred) and one text line per caption line below it.
    """
    if not cells:
        raise ValueError("a contact sheet needs at least one cell")
    if cell < 16:
        raise ValueError(f"cell size {cell} px is too small; use 16 or more")
    columns = columns or min(8, math.ceil(math.sqrt(len(cells))))
    columns = max(1, min(columns, len(cells)))
    grid_rows = math.ceil(len(cells) / columns)
    caption_font, title_font = font(12), font(15)
    line = _line_height(caption_font)
    caption_lines = max(len(c.caption) for c in cells)
    slot_w, slot_h = cell, cell + 4 + caption_lines * line
    top = PAD + (_line_height(title_font) + 4 if title else 0)
    width = PAD + columns * (slot_w + PAD)
    height = top + grid_rows * (slot_h + PAD)
    sheet = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((PAD, PAD), fit_text(title_font, title, width - 2 * PAD), INK, title_font)
    boxes: list[Box] = []
    for i, c in enumerate(cells):
        x, y = PAD + (i % columns) * (slot_w + PAD), top + (i // columns) * (slot_h + PAD)
        draw.rectangle((x - 1, y - 1, x + cell, y + cell), outline=FRAME)
        if c.image is not None:
            tile = thumbnail(c.image, cell)
            left = x + (cell - tile.width) // 2
            upper = y + (cell - tile.height) // 2
            sheet.paste(tile.convert("RGB"), (left, upper))
            boxes.append((left, upper, left + tile.width, upper + tile.height))
        else:
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=(228, 228, 228))
            for k, text in enumerate(_wrap(caption_font, c.placeholder, cell - 8, cell // line)):
                draw.text((x + 4, y + 4 + k * line), text, MUTED, caption_font)
            boxes.append((x, y, x + cell, y + cell))
        for k, text in enumerate(c.caption):
            ink = INK if k == 0 else MUTED
            draw.text(
                (x, y + cell + 4 + k * line),
                fit_text(caption_font, text, slot_w),
                ink,
                caption_font,
            )
    return Sheet(image=sheet, boxes=tuple(boxes), info=tuple(c.info for c in cells))


# --- drawing: the class-balance chart -------------------------------------------------------------

PALETTE = (
    (0, 114, 178),
    (230, 159, 0),
    (0, 158, 115),
    (204, 121, 167),
    (86, 180, 233),
    (213, 94, 0),
    (240, 228, 66),
    (90, 90, 90),
)
"""Okabe and Ito's colour-blind-safe colours, one per split (cycled after eight)."""

PLOT_HEIGHT = 280
"""Pixels of the tallest bar."""


@dataclass(frozen=True)
class Chart(_Picture):
    """A drawn chart, the box of every bar and each split's colour."""

    image: Image.Image
    bars: dict[tuple[str, str], Box]
    """(class, split) -> the bar's box; a zero count has an empty box on the baseline."""
    colors: dict[str, tuple[int, int, int]]


def draw_class_balance(
    counts: Mapping[str, Mapping[str, int]], classes: Sequence[str], title: str = ""
) -> Chart:
    """A grouped bar chart: one group per class, one bar per split (`counts[split][class]`),
    each bar labelled with its count, the class name under the group, a legend with totals.

    Bar heights are `round(PLOT_HEIGHT * count / max count)` pixels. Class names wider than
    their group are written vertically so that many classes stay readable.
    """
    splits = ordered_splits(list(counts))
    if not splits or not classes:
        raise ValueError("nothing to draw: no split or no class")
    colors = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(splits)}
    small, label_font, title_font = font(11), font(13), font(15)
    line = _line_height(label_font)
    top_count = max((counts[s].get(c, 0) for s in splits for c in classes), default=0)
    ticks = _ticks(top_count)
    scale_max = max(top_count, 1)

    bar_w = max(14, math.ceil(max(_text_width(small, str(v)) for v in (*ticks, top_count))) + 4)
    group_w = len(splits) * bar_w + (len(splits) - 1) * 2
    label_w = max(_text_width(label_font, _printable(label_font, c)) for c in classes)
    vertical = label_w > max(group_w, 90)
    max_label = 160
    slot = (max(group_w, line) if vertical else max(group_w, math.ceil(label_w))) + 16
    label_h = (min(math.ceil(label_w), max_label) if vertical else line) + 6

    left = 12 + math.ceil(max(_text_width(small, str(t)) for t in ticks)) + 8
    legend = [f"{s}: {sum(counts[s].get(c, 0) for c in classes)}" for s in splits]
    legend_w = sum(math.ceil(_text_width(label_font, t)) + 34 for t in legend)
    title_h = _line_height(title_font) + 6 if title else 0
    base = PAD + title_h + line + 10 + _line_height(small) + PLOT_HEIGHT  # y of the x axis
    width = max(left + len(classes) * slot + PAD, legend_w + 2 * PAD, 320)
    if title:
        width = max(width, min(1200, math.ceil(_text_width(title_font, title)) + 2 * PAD))
    height = base + 4 + label_h + PAD

    image = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((PAD, PAD), fit_text(title_font, title, width - 2 * PAD), INK, title_font)
    x = PAD
    for split, text in zip(splits, legend, strict=True):
        y = PAD + title_h
        draw.rectangle((x, y + 2, x + line - 4, y + line - 2), fill=colors[split])
        draw.text((x + line, y), text, INK, label_font)
        x += math.ceil(_text_width(label_font, text)) + 34
    for t in ticks:
        y = base - round(PLOT_HEIGHT * t / scale_max)
        draw.line((left, y, width - PAD, y), fill=(225, 225, 225))
        draw.text((left - 6, y), str(t), MUTED, small, anchor="rm")
    draw.line((left, base, width - PAD, base), fill=INK)
    draw.line((left, base - PLOT_HEIGHT - 4, left, base), fill=INK)

    bars: dict[tuple[str, str], Box] = {}
    for i, name in enumerate(classes):
        x0 = left + i * slot + (slot - group_w) // 2
        for j, split in enumerate(splits):
            n = counts[split].get(name, 0)
            bx = x0 + j * (bar_w + 2)
            h = round(PLOT_HEIGHT * n / scale_max)
            bars[(name, split)] = (bx, base - h, bx + bar_w, base)
            if h:
                draw.rectangle((bx, base - h, bx + bar_w - 1, base - 1), fill=colors[split])
            draw.text((bx + bar_w / 2, base - h - 2), str(n), INK, small, anchor="md")
        centre = left + i * slot + slot // 2
        if vertical:
            text = fit_text(label_font, name, max_label)
            strip = Image.new("L", (math.ceil(_text_width(label_font, text)) + 2, line), 0)
            ImageDraw.Draw(strip).text((1, 0), text, 255, label_font)
            strip = strip.rotate(90, expand=True)
            image.paste(INK, (centre - strip.width // 2, base + 6), strip)
        else:
            draw.text(
                (centre, base + 4), _printable(label_font, name), INK, label_font, anchor="ma"
            )
    return Chart(image=image, bars=bars, colors=colors)


def _ticks(top: int) -> list[int]:
    """Round axis values from 0 to at least `top`: steps of 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return [0]
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return list(range(0, top + 1, max(1, int(step))))
