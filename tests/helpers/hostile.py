"""A generator of hostile source trees: every kind of entry a messy real folder holds, each
with the outcome a run must give it (packed, or rejected with a reason).

Used by tests/run/test_hostile.py. Everything is made in a folder the test owns; nothing outside it
is touched (links point inside it, or at a sibling 'outside' folder the test also owns).
"""

from __future__ import annotations

import io
import os
import socket
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

MAX_FILE_BYTES = 1 << 20
"""The config's source.max_file_bytes: the tree holds a (sparse) file above it."""


@dataclass
class HostileTree:
    root: Path
    """The source folder (one sub-folder per class)."""
    outside: Path
    """A sibling folder that links lead to."""
    expected: dict[bytes, str] = field(default_factory=dict)
    """Raw path relative to root -> 'packed' or the reject reason."""
    marker: Path | None = None
    """A file a fake Ghostscript would create if Pillow ever ran it."""
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def _photo(seed: int, size: tuple[int, int] = (48, 40)) -> Image.Image:
    """A smooth test picture (gradients plus a disc), so lossy formats keep it recognisable."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y + seed * 40) % 256])
    disc = (x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 3) ** 2
    rgb[:, disc] = 255 - rgb[:, disc]
    return Image.fromarray(rgb.transpose(1, 2, 0).astype(np.uint8))


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def short_gif(width: int, height: int) -> bytes:
    """A GIF whose complete LZW stream (end code and trailer included) holds `height` rows,
    while both its screen and its image descriptor declare twice as many."""
    rng = np.random.default_rng(height)
    data = bytearray(
        encode(Image.fromarray(rng.integers(1, 255, (height, width, 3), np.uint8)), "GIF")
    )
    declared = struct.pack("<H", 2 * height)
    data[8:10] = declared
    at = data.index(b"\x2c\x00\x00\x00\x00" + struct.pack("<HH", width, height))
    data[at + 7 : at + 9] = declared
    return bytes(data)


def short_tiff(width: int, height: int, compression: str) -> bytes:
    """A TIFF whose one strip is complete for `height` rows, while ImageLength and RowsPerStrip
    declare twice as many."""
    rng = np.random.default_rng(height)
    image = Image.fromarray(rng.integers(1, 255, (height, width, 3), np.uint8))
    data = bytearray(encode(image, "TIFF", compression=compression))
    assert data[:2] == b"II"
    ifd = struct.unpack("<I", data[4:8])[0]
    for k in range(struct.unpack("<H", data[ifd : ifd + 2])[0]):
        entry = ifd + 2 + 12 * k
        tag, kind = struct.unpack("<HH", data[entry : entry + 4])
        if tag in (257, 278):  # ImageLength, RowsPerStrip
            size = "<H" if kind == 3 else "<I"
            data[entry + 8 : entry + 8 + struct.calcsize(size)] = struct.pack(size, 2 * height)
    return bytes(data)


def short_webp(width: int, height: int, lossless: bool) -> bytes:
    """A WebP cut at two thirds, its RIFF and chunk sizes rewritten to match what is left."""
    rng = np.random.default_rng(height)
    image = Image.fromarray(rng.integers(1, 255, (height, width, 3), np.uint8))
    data = bytearray(encode(image, "WEBP", lossless=lossless, quality=90))
    cut = data[: len(data) * 2 // 3]
    cut[4:8] = struct.pack("<I", len(cut) - 8)
    cut[16:20] = struct.pack("<I", len(cut) - 20)
    return bytes(cut)


def short_png(width: int, height: int, rows: int) -> bytes:
    """A well-formed RGB PNG that declares width x height but whose complete zlib stream holds
    only `rows` rows."""
    raw = b"".join(b"\x00" + bytes(width * 3) for _ in range(rows))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(raw))
        + png_chunk(b"IEND", b"")
    )


def bomb_png(side: int) -> bytes:
    """A PNG header declaring side x side pixels, with almost no data."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def jpeg_claiming(data: bytes, width: int, height: int) -> bytes:
    """A JPEG whose frame header claims width x height over the data of a smaller picture."""
    patched = bytearray(data)
    at = patched.find(b"\xff\xc0")
    struct.pack_into(">HH", patched, at + 5, height, width)
    return bytes(patched)


XBM = (
    b"#define im_width 16\n#define im_height 16\nstatic char im_bits[] = {\n"
    + b", ".join([b"0x00"] * 32)
    + b"};\n"
)
EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n"
    b"newpath 0 0 moveto 16 16 lineto stroke\nshowpage\n%%EOF\n"
)


def _write(path: bytes, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def make_hostile_tree(base: Path) -> HostileTree:
    """Build the tree under base/'src' (and base/'outside'); see HostileTree.expected."""
    root, outside = base / "src", base / "outside"
    tree = HostileTree(root, outside)
    broot = os.fsencode(root)
    outside.mkdir(parents=True)
    (outside / "secret.jpg").write_bytes(encode(_photo(9), "JPEG"))

    def add(relative: bytes, data: bytes, outcome: str) -> None:
        _write(broot + b"/" + relative, data)
        tree.expected[relative] = outcome

    jpeg = encode(_photo(1, (64, 48)), "JPEG", quality=90)
    # --- good images in every allowed format, under every kind of odd name
    add(b"good/plain.jpg", jpeg, "packed")
    add(b"good/progressive.jpg", encode(_photo(2), "JPEG", progressive=True), "packed")
    add(b"good/lossless.png", encode(_photo(3), "PNG"), "packed")
    add(b"good/interlaced.png", encode(_photo(4), "PNG", interlace=1), "packed")
    add(b"good/pic.bmp", encode(_photo(5), "BMP"), "packed")
    add(b"good/pic.gif", encode(_photo(6).convert("P"), "GIF"), "packed")
    add(b"good/pic.tif", encode(_photo(7), "TIFF", compression="tiff_deflate"), "packed")
    add(b"good/pic.webp", encode(_photo(8), "WEBP", lossless=True), "packed")
    add(b"good/caf\xe9-latin1.jpg", encode(_photo(10), "JPEG"), "packed")
    add(b"good/back\\slash.jpg", encode(_photo(11), "JPEG"), "packed")
    add(b"good/new\nline.jpg", encode(_photo(12), "JPEG"), "packed")
    add(b"good/tab\there.png", encode(_photo(13), "PNG"), "packed")
    add(b"good/-rf --leading-dash.jpg", encode(_photo(14), "JPEG"), "packed")
    add(b"good/hex:deadbeef.jpg", encode(_photo(15), "JPEG"), "packed")
    add("good/日本語 ü.png".encode(), encode(_photo(16), "PNG"), "packed")
    add(b"good/" + b"n" * 251 + b".jpg", encode(_photo(17), "JPEG"), "packed")
    add(b"cl\xffass/in-odd-class.jpg", encode(_photo(18), "JPEG"), "packed")
    # --- not images, or not allowed ones
    add(b"bad/empty.jpg", b"", "unreadable")
    add(b"bad/text.jpg", b"hello, this is not a picture\n" * 4, "unreadable")
    add(b"bad/xbm-named.png", XBM, "format_not_allowed")
    add(b"bad/pgm-text.jpg", b"P2\n2 2\n255\n0 1 2 3\n", "format_not_allowed")
    add(b"bad/eps-named.jpg", EPS, "format_not_allowed")
    # --- data that ends before the image does, in every format
    add(b"bad/cut.jpg", jpeg[: len(jpeg) // 2], "truncated")
    add(b"bad/cut-eoi.jpg", jpeg[: len(jpeg) // 2] + b"\xff\xd9", "truncated")
    add(b"bad/claims-big.jpg", jpeg_claiming(jpeg, 4000, 3000), "truncated")
    png = encode(_photo(19, (64, 48)), "PNG")
    add(b"bad/cut.png", png[: len(png) // 2], "truncated")
    add(b"bad/short-stream.png", short_png(900, 900, 3), "truncated")
    add(b"bad/short-stream.gif", short_gif(60, 40), "truncated")
    add(b"bad/short-stream.tif", short_tiff(60, 40, "raw"), "truncated")
    add(b"bad/short-deflate.tif", short_tiff(60, 40, "tiff_deflate"), "corrupt")
    add(b"bad/short-stream.webp", short_webp(60, 40, lossless=True), "corrupt")
    for fmt, suffix in (("GIF", b"gif"), ("TIFF", b"tif"), ("BMP", b"bmp"), ("WEBP", b"webp")):
        image = _photo(20, (64, 48))
        data = encode(image.convert("P") if fmt == "GIF" else image, fmt)
        add(b"bad/cut." + suffix, data[: len(data) // 2], "truncated")
    add(b"bad/bomb.png", bomb_png(100_000), "too_large")
    # --- files that must never be opened or read
    os.mkfifo(broot + b"/bad/pipe.jpg")
    tree.expected[b"bad/pipe.jpg"] = "not_a_file"
    os.symlink(b"pipe.jpg", broot + b"/bad/link-to-pipe.jpg")
    tree.expected[b"bad/link-to-pipe.jpg"] = "not_a_file"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.fsdecode(broot + b"/bad/sock.png"))
    tree.sockets.append(sock)
    tree.expected[b"bad/sock.png"] = "not_a_file"
    os.symlink(b"../good", broot + b"/bad/folder-link.jpg")
    tree.expected[b"bad/folder-link.jpg"] = "not_a_file"
    os.symlink(b"loop.jpg", broot + b"/bad/loop.jpg")
    tree.expected[b"bad/loop.jpg"] = "io_error"
    os.symlink(os.fsencode(outside / "secret.jpg"), broot + b"/bad/escape.jpg")
    tree.expected[b"bad/escape.jpg"] = "outside_root"
    os.symlink(b"/dev/null", broot + b"/bad/devnull.jpg")
    tree.expected[b"bad/devnull.jpg"] = "outside_root"
    with open(broot + b"/bad/huge.jpg", "wb") as f:
        f.truncate(MAX_FILE_BYTES * 3)  # sparse: costs no disk
    tree.expected[b"bad/huge.jpg"] = "file_too_large"
    add(b"stray.jpg", jpeg, "no_class")
    # --- a folder whose path is longer than the OS allows: one reject, the walk goes on
    _deep_folder(broot + b"/deep", tree)
    # --- a fake Ghostscript on PATH: it leaves a marker if anything ever runs it
    tree.marker = base / "gs-ran"
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "gs").write_text(f"#!/bin/sh\ntouch {tree.marker}\nexit 1\n")
    (bin_dir / "gs").chmod(0o755)
    return tree


def _deep_folder(top: bytes, tree: HostileTree) -> None:
    """Nested folders past PATH_MAX, made relative to open folders (a path that long cannot be
    passed whole). The walk can list down to the first folder whose full path is too long."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    part = b"d" * 200
    relative = top.rsplit(b"/", 1)[1]
    try:
        while len(os.fsencode(tree.root)) + 1 + len(relative) < 4096:  # PATH_MAX counts the NUL
            os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            relative += b"/" + part
        # the folder at `relative` cannot be listed by path: its length is over the limit
        tree.expected[relative + b"/"] = "folder_unreadable"
    finally:
        os.close(fd)
