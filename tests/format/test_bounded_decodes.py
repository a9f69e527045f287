"""Bounded decodes (NOTE [ bounded decodes ] in etl.format.codecs): a stored sample's declared
size is someone's word. A zlib stream of a megabyte declared as 16384x21845x3 (a gigabyte) and
a version whose manifest declares one sample that large (re-sealed, as a hostile writer
would) are refused in one line naming the sample and the cap, within a time limit and without
allocating it; `ETL_MAX_PIXELS` raises the cap, and then a stream that does not fill its
declared size is still refused, inflated a step at a time into the sample's own pixels."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from etl.config import load_config
from etl.errors import EtlError, ManifestError
from etl.format.codecs import MAX_PIXELS, DecodeFailure, decode
from etl.format.record import RECORD_FILE, write_record
from etl.run import pipeline
from loaders import PackedDataset
from tests.helpers.codecs import write_config, write_photos

BOMB = (16384, 21845, 3)


@pytest.mark.timeout(60)
def test_a_zlib_bomb_is_refused_before_anything_is_allocated() -> None:
    """In a fresh process: the decode of a 1 MB stream declared as a gigabyte is refused, and
    the process's peak memory stays far below the declared size."""
    code = (
        "import zlib, numpy as np\n"
        "from etl.format.codecs import DecodeFailure, decode\n"
        f"data = zlib.compress(bytes({BOMB[0] * BOMB[1] * BOMB[2]} // 1000))\n"
        "try:\n"
        f"    decode(np.frombuffer(data, np.uint8), 'zlib', {BOMB})\n"
        "    print('decoded')\n"
        "except DecodeFailure as exc:\n"
        "    print('refused', exc)\n"
        "print(next(int(line.split()[1]) for line in open('/proc/self/status')\n"
        "           if line.startswith('VmHWM:')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    said, peak = done.stdout.strip().splitlines()
    assert said.startswith("refused") and "16384x21845x3" in said and "ETL_MAX_PIXELS" in said
    # NOTE: VmHWM, this process's own peak (ru_maxrss keeps the parent's across fork and exec)
    assert int(peak) < 400 * 1024, f"peak {int(peak) // 1024} MB"  # KB; the bomb is 1 GB


def test_a_stream_short_of_or_past_its_declared_size_is_refused() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    data = zlib.compress(pixels.tobytes())
    np.testing.assert_array_equal(decode(data, "zlib", (30, 20, 3)), pixels)
    for shape in ((30, 20, 2), (31, 20, 3)):
        with pytest.raises(DecodeFailure, match="does not inflate"):
            decode(data, "zlib", shape)
    with pytest.raises(DecodeFailure, match="does not inflate"):
        decode(zlib.compress(pixels.tobytes() * 2), "zlib", (30, 20, 3))


def _declare(out: Path, index: int, height: int, width: int) -> str:
    """Manifest row `index` of the latest version re-declared as height x width, the commit
    record sealed again over it (a hostile writer's version): its source."""
    (folder,) = sorted((out / "versions").glob("v*"))[-1:]
    table = ipc.open_file(str(folder / "manifest.arrow")).read_all()
    for name, value in (("sample_height", height), ("sample_width", width)):
        column = table.column(name).to_pylist()
        column[index] = value
        at = table.schema.get_field_index(name)
        table = table.set_column(
            at, table.schema.field(at), pa.array(column, table.schema.field(at).type)
        )
    with ipc.new_file(str(folder / "manifest.arrow"), table.schema) as writer:
        writer.write_table(table)
    files = tuple(json.loads((folder / RECORD_FILE).read_text())["files"])
    write_record(folder, int(folder.name[1:]), files)
    return str(table.column("source")[index].as_py())


@pytest.mark.timeout(120)
def test_a_version_declaring_a_bomb_is_not_opened_unless_the_cap_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_photos(tmp_path / "images", count=6)
    config = write_config(tmp_path, "zlib", resize="mode: keep_aspect, shorter: 24, longer: 40")
    assert pipeline.run(load_config(config)).committed
    source = _declare(tmp_path / "out", 2, *BOMB[:2])
    with pytest.raises(ManifestError) as raised:
        PackedDataset.open(tmp_path / "out")
    message = str(raised.value)
    assert source in message and "16384x21845" in message and f"{MAX_PIXELS:,}" in message
    assert "\n" not in message
    monkeypatch.setenv("ETL_MAX_PIXELS", str(BOMB[0] * BOMB[1]))
    ds = PackedDataset.open(tmp_path / "out", verify=False)
    with pytest.raises(EtlError, match="does not inflate"):
        ds.gather(np.arange(len(ds)))


def test_a_preview_of_a_large_jpeg_is_decoded_at_a_reduced_scale() -> None:
    """A 768x1024 JPEG sample previewed for a 96 px cell: decoded at 1/4 (the smallest DCT
    scale that keeps twice the cell), not in full; its pixels within a few levels of Pillow's
    own reduced decode of the same file (`Image.draft`), an independent decoder."""
    import io

    from PIL import Image

    from etl.format.flat import stored_sample

    y, x = np.mgrid[0:768, 0:1024]
    photo = np.stack([(x // 4) % 256, (y // 3) % 256, ((x + y) // 5) % 256], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, "JPEG", quality=90)
    data = np.frombuffer(buffer.getvalue(), np.uint8)
    args = (data, 0, (0, 768, 1024), (0, 0, 3), "HWC", (len(data), "jpeg"))
    preview = stored_sample(*args, longest=96)
    assert preview.shape == (192, 256, 3)
    assert stored_sample(*args).shape == (768, 1024, 3)
    with Image.open(io.BytesIO(buffer.getvalue())) as pillow:
        pillow.draft("RGB", (256, 192))
        reduced = np.asarray(pillow.convert("RGB"))
    assert reduced.shape == preview.shape
    assert np.abs(reduced.astype(int) - preview).mean() < 2
