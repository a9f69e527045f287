"""Pictures with Pillow alone: contact sheets of thumbnails and class-balance bar charts,
which show themselves inline in Jupyter. No plotting library is needed."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from PIL import Image, ImageDraw, ImageFont

from etl.errors import ConfigError, OutputError
from etl.format.atomic import replacing
from etl.format.schema import ordered_splits

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


@dataclass(frozen=True)
class _Fonts:
    small: Any
    label: Any
    title: Any


@dataclass(frozen=True)
class _Layout:
    """Where a class-balance chart's parts go, in pixels: each class a slot of `slot` wide
    holding its group of bars (`bar_w` each, `group_w` together), the plot's left edge and
    baseline, and the class names under it, written vertically where they are too wide."""

    bar_w: int
    group_w: int
    slot: int
    vertical: bool
    label_h: int
    left: int
    base: int
    title_h: int
    line: int
    width: int
    height: int


MAX_LABEL = 160
"""Pixels of the longest class name written vertically."""


def _layout(
    classes: Sequence[str],
    splits: Sequence[str],
    ticks: list[int],
    top_count: int,
    legend_w: int,
    title: str,
    fonts: _Fonts,
) -> _Layout:
    """The chart's measures, from the widest count, class name, tick and legend."""
    line = _line_height(fonts.label)
    widest = max(_text_width(fonts.small, str(v)) for v in (*ticks, top_count))
    bar_w = max(14, math.ceil(widest) + 4)
    group_w = len(splits) * bar_w + (len(splits) - 1) * 2
    label_w = max(_text_width(fonts.label, _printable(fonts.label, c)) for c in classes)
    vertical = label_w > max(group_w, 90)
    slot = (max(group_w, line) if vertical else max(group_w, math.ceil(label_w))) + 16
    label_h = (min(math.ceil(label_w), MAX_LABEL) if vertical else line) + 6
    left = 12 + math.ceil(max(_text_width(fonts.small, str(t)) for t in ticks)) + 8
    title_h = _line_height(fonts.title) + 6 if title else 0
    base = PAD + title_h + line + 10 + _line_height(fonts.small) + PLOT_HEIGHT  # the x axis
    width = max(left + len(classes) * slot + PAD, legend_w + 2 * PAD, 320)
    if title:
        width = max(width, min(1200, math.ceil(_text_width(fonts.title, title)) + 2 * PAD))
    return _Layout(
        bar_w, group_w, slot, vertical, label_h, left, base, title_h, line, width,
        base + 4 + label_h + PAD,
    )  # fmt: skip


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
    fonts = _Fonts(font(11), font(13), font(15))
    top_count = max((counts[s].get(c, 0) for s in splits for c in classes), default=0)
    ticks, scale_max = _ticks(top_count), max(top_count, 1)
    legend = [f"{s}: {sum(counts[s].get(c, 0) for c in classes)}" for s in splits]
    legend_w = sum(math.ceil(_text_width(fonts.label, t)) + 34 for t in legend)
    at = _layout(classes, splits, ticks, top_count, legend_w, title, fonts)
    image = Image.new("RGB", (at.width, at.height), PAPER)
    draw = ImageDraw.Draw(image)
    keys = zip(legend, [colors[s] for s in splits], strict=True)
    _draw_frame(draw, at, fonts, title, keys, ticks, scale_max)
    bars: dict[tuple[str, str], Box] = {}
    for i, name in enumerate(classes):
        x0 = at.left + i * at.slot + (at.slot - at.group_w) // 2
        for j, split in enumerate(splits):
            n = counts[split].get(name, 0)
            bx = x0 + j * (at.bar_w + 2)
            h = round(PLOT_HEIGHT * n / scale_max)
            bars[(name, split)] = (bx, at.base - h, bx + at.bar_w, at.base)
            if h:
                draw.rectangle(
                    (bx, at.base - h, bx + at.bar_w - 1, at.base - 1), fill=colors[split]
                )
            draw.text((bx + at.bar_w / 2, at.base - h - 2), str(n), INK, fonts.small, anchor="md")
        _draw_class_name(image, draw, at, fonts, name, at.left + i * at.slot + at.slot // 2)
    return Chart(image=image, bars=bars, colors=colors)


def _draw_frame(
    draw: ImageDraw.ImageDraw,
    at: _Layout,
    fonts: _Fonts,
    title: str,
    legend: Iterable[tuple[str, tuple[int, int, int]]],
    ticks: list[int],
    scale_max: int,
) -> None:
    """The title, the legend (each split's colour and total), the ticks and the axes."""
    if title:
        draw.text((PAD, PAD), fit_text(fonts.title, title, at.width - 2 * PAD), INK, fonts.title)
    x, y = PAD, PAD + at.title_h
    for text, color in legend:
        draw.rectangle((x, y + 2, x + at.line - 4, y + at.line - 2), fill=color)
        draw.text((x + at.line, y), text, INK, fonts.label)
        x += math.ceil(_text_width(fonts.label, text)) + 34
    for t in ticks:
        y = at.base - round(PLOT_HEIGHT * t / scale_max)
        draw.line((at.left, y, at.width - PAD, y), fill=(225, 225, 225))
        draw.text((at.left - 6, y), str(t), MUTED, fonts.small, anchor="rm")
    draw.line((at.left, at.base, at.width - PAD, at.base), fill=INK)
    draw.line((at.left, at.base - PLOT_HEIGHT - 4, at.left, at.base), fill=INK)


def _draw_class_name(
    image: Image.Image,
    draw: ImageDraw.ImageDraw,
    at: _Layout,
    fonts: _Fonts,
    name: str,
    centre: int,
) -> None:
    """A class's name under its group, centred on `centre`: vertical where too wide."""
    if at.vertical:
        text = fit_text(fonts.label, name, MAX_LABEL)
        strip = Image.new("L", (math.ceil(_text_width(fonts.label, text)) + 2, at.line), 0)
        ImageDraw.Draw(strip).text((1, 0), text, 255, fonts.label)
        strip = strip.rotate(90, expand=True)
        image.paste(INK, (centre - strip.width // 2, at.base + 6), strip)
    else:
        label = _printable(fonts.label, name)
        draw.text((centre, at.base + 4), label, INK, fonts.label, anchor="ma")


def _ticks(top: int) -> list[int]:
    """Round axis values from 0 to at least `top`: steps of 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return [0]
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return list(range(0, top + 1, max(1, int(step))))


def save_png(image: Image.Image, path: Path) -> None:
    """`image` written to `path` through a temp file and a rename, so a reader never sees half
    a PNG; ConfigError for a name that does not end in .png, OutputError for a folder that is
    missing or cannot be written (one line, never a traceback)."""
    if path.suffix.lower() != ".png":
        raise ConfigError(f"{path}: the picture is a PNG; end the name in .png")
    if not path.parent.is_dir():
        raise OutputError(f"{path.parent}: no such folder for {path.name}")
    with replacing(path) as temp:
        image.save(temp, format="PNG")
