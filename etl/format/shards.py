"""The shard format: plain `.npy` files of shape [rows, *sample_shape], dtype uint8.

`np.load(path, mmap_mode="r")` opens a shard with no code of ours. The writer appends rows to a
temp file with plain writes (no pixel data ever travels between processes), hashing them as
they go, then rewrites the header with the rows actually written and renames the file into
place, so a process never sees a partial shard under a shard's name. It fsyncs before the rename
unless told that its caller will (`durable=False`, see `etl.run.execute.pack`): either way every
shard is on disk before a manifest that references it is committed.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.checksums import TAMPER_DIGEST, Hasher, digest, file_digests, new_hasher
from etl.format.npy import NpyHeaderError, parse_header, read_head

SHARDS_DIR = "shards"
"""The folder of a dataset that holds its shard files (and a run's temp files)."""

NPY_MAGIC = b"\x93NUMPY\x01\x00"
HEADER_BYTES = 128
"""Total .npy header length (magic + length field + dict, space-padded): a multiple of 64 as the
format asks, and long enough for any 4-d shape, so a header can be rewritten in place."""


def npy_header(shape: tuple[int, ...]) -> bytes:
    """A version 1.0 .npy header for a C-ordered uint8 array, padded to HEADER_BYTES."""
    body = f"{{'descr': '|u1', 'fortran_order': False, 'shape': {shape!r}, }}"
    room = HEADER_BYTES - len(NPY_MAGIC) - 2
    if len(body) + 1 > room:
        raise ValueError(f"shape {shape} does not fit in a {HEADER_BYTES}-byte .npy header")
    body = body.ljust(room - 1) + "\n"
    return NPY_MAGIC + struct.pack("<H", room) + body.encode("latin1")


def fsync_dir(path: Path) -> None:
    """Make a rename inside directory `path` durable; on a file, make its data durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SHARD_NAME = re.compile(r"^v(\d{6})-(?:[0-9a-f]{8}-)?\d{5}\.npy$")
WRITER_TAG = re.compile(r"^[0-9a-f]{8}$")


def shard_name(version: int, index: int, writer: str = "") -> str:
    """The `index`-th shard written for `version`: 'shards/v000003-00012.npy'. A shard keeps
    the version that wrote it for life, so a reader can tell leftovers of uncommitted versions.

    `writer` (8 hex digits) tags the shards of one attempt to publish to object storage,
    'shards/v000003-1f2e3d4c-00012.npy': two writers racing for the same version there never
    write the same object (NOTE [ publishing to a store ] in etl.storage.publish)."""
    if writer and not WRITER_TAG.match(writer):
        raise ValueError(f"writer tag {writer!r} is not 8 hex digits")
    tag = f"{writer}-" if writer else ""
    return f"{SHARDS_DIR}/v{version:06d}-{tag}{index:05d}.npy"


def shard_version(file_name: str) -> int | None:
    """The version a shard file was written for ('v000003-00012.npy' -> 3), None for a name
    the format does not define."""
    match = _SHARD_NAME.match(file_name)
    return int(match.group(1)) if match else None


def check_fits(sample: NDArray[Any], sample_shape: tuple[int, ...], shard: str) -> None:
    """A ValueError unless `sample` is a uint8 array of the shard's sample shape (where that
    shape says 0, samples that keep their aspect ratio: any positive size)."""
    pairs = zip(sample.shape, sample_shape, strict=False)
    fits = len(sample.shape) == len(sample_shape) and all(
        d == want or (want == 0 and d > 0) for d, want in pairs
    )
    if not fits or sample.dtype != np.uint8:
        raise ValueError(
            f"sample of shape {sample.shape} {sample.dtype} does not fit shard "
            f"{shard} of {sample_shape} uint8"
        )


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records about one finished shard file."""

    name: str
    """Path relative to the dataset root, e.g. 'shards/v000001-00003.npy'."""
    rows: int
    bytes: int
    checksum: str
    blake3: str

    def record(self) -> dict[str, Any]:
        """Its row of shards.arrow."""
        return {
            "shard": self.name,
            "rows": self.rows,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "blake3": self.blake3,
        }


class ShardWriter:
    """Writes one shard. Use as a context manager; call `finish()` to publish it.

    Leaving the block without `finish()` (an exception, a kill) leaves at most a hidden temp file
    `.tmp-<name>-<pid>`, which the next run removes; never a file under the shard's name.
    `durable=False` skips the fsyncs: the caller must fsync the shard and its folder
    (`fsync_dir`) before committing a manifest that references it.

    A `sample_shape` with 0 sides (samples that keep their aspect ratio) writes one flat array
    of the samples' bytes; `placed` then says where each row went. So does (0,): samples stored
    encoded (`etl.format.codecs`), each a 1-d run of bytes.
    """

    def __init__(
        self,
        root: Path,
        name: str,
        capacity: int,
        sample_shape: tuple[int, ...],
        checksum: str,
        durable: bool = True,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"shard capacity must be positive, got {capacity}")
        self.flat = 0 in sample_shape
        flat_bytes = tuple(sample_shape) == (0,)  # samples stored encoded: runs of bytes
        if any(d < 0 for d in sample_shape) or (
            self.flat and not any(sample_shape) and not flat_bytes
        ):
            raise ValueError(f"invalid sample shape {sample_shape}")
        self.placed: list[tuple[int, tuple[int, ...]]] = []
        """Per row written, (byte offset in the data, shape)."""
        self.data_bytes = 0
        self.root = root
        self.name = name
        self.final_path = root / name
        self.temp_path = self.final_path.with_name(f".tmp-{self.final_path.name}-{os.getpid()}")
        self.capacity = capacity
        self.sample_shape = tuple(sample_shape)
        self.sample_bytes = int(np.prod(sample_shape))
        self.checksum = checksum
        self.durable = durable
        self.rows = 0
        self._file: BinaryIO | None = None
        self._digests: tuple[Hasher, Hasher] = (new_hasher(checksum), new_hasher(TAMPER_DIGEST))

    def __enter__(self) -> ShardWriter:
        self.final_path.parent.mkdir(parents=True, exist_ok=True)
        # NOTE [ write, not memmap ]: rows arrive in order, so appending with write() is all a
        # shard needs. Writing through a memmap of a fresh sparse file costs a page fault and a
        # block allocation per 4 KiB page plus an msync before the fsync: 1.0 ms against 0.5 ms
        # per 224x224x3 sample (benchmarks/pack/throughput.py), ~10% of the time to pack a photo.
        self._file = open(self.temp_path, "wb")  # closed in finish() or __exit__
        shape = (0,) if self.flat else (self.capacity, *self.sample_shape)
        self._write(npy_header(shape))  # a flat shard's is rewritten by `finish`
        return self

    def _write(self, data: bytes | memoryview) -> None:
        """Append to the file and to the shard digests.

        NOTE [ hash while writing ]: the digests cover the whole file, header first; the header
        written first declares `capacity` rows, so they are final when every row was written
        (no reject in the shard, the usual case). Otherwise `finish` hashes the file again.
        Hashing rows here, while they are in the CPU's cache, saves reading the shard back.
        """
        assert self._file is not None
        self._file.write(data)
        for hasher in self._digests:
            hasher.update(data)

    def append(self, sample: NDArray[np.uint8]) -> tuple[int, str]:
        """Store one sample; returns (row, checksum of the stored bytes)."""
        if self._file is None:
            raise RuntimeError("ShardWriter used outside its 'with' block")
        check_fits(sample, self.sample_shape, self.name)
        if self.rows >= self.capacity:
            raise ValueError(f"shard {self.name} is full ({self.capacity} rows)")
        sample = np.ascontiguousarray(sample)
        self._write(memoryview(sample.data).cast("B"))
        self.placed.append((self.data_bytes, sample.shape))
        self.data_bytes += sample.nbytes
        row = self.rows
        self.rows += 1
        return row, digest(sample, self.checksum)

    def skip(self) -> None:
        """A source meant for this shard became a reject: it takes no row."""

    def finish(self) -> ShardInfo | None:
        """Rewrite the header for the rows written, fsync (if durable), rename into place. None
        if no row was written."""
        if self._file is None:
            raise RuntimeError("finish() called outside the 'with' block")
        f, self._file = self._file, None
        with f:
            if self.rows == 0:
                f.close()
                self.temp_path.unlink(missing_ok=True)
                return None
            whole = self.rows == self.capacity and not self.flat
            if not whole:
                f.seek(0)
                f.write(
                    npy_header((self.data_bytes,) if self.flat else (self.rows, *self.sample_shape))
                )
            f.flush()
            if self.durable:
                os.fsync(f.fileno())
        size = HEADER_BYTES + self.data_bytes
        if whole:
            checksum, tamper = (h.hexdigest() for h in self._digests)
        else:
            checksum, tamper = file_digests(self.temp_path, (self.checksum, TAMPER_DIGEST))
        os.replace(self.temp_path, self.final_path)
        if self.durable:
            fsync_dir(self.final_path.parent)
        return ShardInfo(self.name, self.rows, size, checksum, tamper)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.temp_path.unlink(missing_ok=True)


def read_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a .npy file, parsed without executing anything; any
    damage to the header, of whatever kind, is one ShardError naming the file."""
    try:
        with open(path, "rb", buffering=0) as f:
            if hasattr(os, "posix_fadvise"):  # the header's page, not a readahead window
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            head = read_head(f)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file is missing") from None
    except OSError as exc:
        raise ShardError(f"{path}: cannot be read ({exc})") from None
    try:
        shape, dtype, fortran, offset = parse_header(head)
    except NpyHeaderError as exc:
        raise ShardError(f"{path}: not a valid .npy file ({exc})") from None
    if fortran:
        raise ShardError(f"{path}: shard is Fortran-ordered; expected C order")
    return shape, dtype, offset


def check_shard(path: Path, sample_shape: tuple[int, ...], rows: int) -> int:
    """The data offset of a shard, after checking that it is what the manifest says it is.
    A `sample_shape` with a 0 side (samples that keep their aspect ratio) is one flat uint8
    array of the file's bytes (`etl.format.schema.RAGGED_FORMAT_VERSION`)."""
    shape, dtype, offset = read_header(path)
    if dtype != np.uint8:
        raise ShardError(f"{path}: dtype {dtype}, expected uint8")
    if 0 in sample_shape:
        size = path.stat().st_size
        if len(shape) != 1 or size != offset + shape[0]:
            raise ShardError(
                f"{path}: shape {shape} in a file of {size} bytes; expected one flat array of "
                f"the {size - offset} bytes after the header"
            )
        return offset
    expected = (rows, *sample_shape)
    if shape != expected:
        raise ShardError(f"{path}: shape {shape}, expected {expected}")
    size = path.stat().st_size
    if size != offset + int(np.prod(expected)):
        raise ShardError(
            f"{path}: {size} bytes on disk, expected {offset + int(np.prod(expected))} "
            "(truncated or padded)"
        )
    return offset


def open_shard(path: Path, sample_shape: tuple[int, ...], rows: int) -> np.memmap:
    """Open a shard read-only after checking that it is what the manifest says it is: [rows,
    *sample_shape], or flat where samples keep their aspect ratio (see `check_shard`)."""
    offset = check_shard(path, sample_shape, rows)
    if 0 in sample_shape:
        return np.memmap(path, dtype=np.uint8, mode="r", offset=offset)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(rows, *sample_shape))
