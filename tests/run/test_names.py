"""Any file name the file system allows round-trips: run -> manifest -> audit -> show.

The expected `source` spelling is written out here from docs/FORMAT.md, apart from etl.format.names.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from etl.config import load_config
from etl.explore.dataset import open_dataset
from etl.format import names
from etl.maintenance.audit import AuditOptions, audit
from etl.run import pipeline

# A name component: any bytes but '/' and NUL, not a dot-file (the walk skips those), and
# short enough to take a '.png' suffix within NAME_MAX (255 bytes).
component = st.binary(min_size=1, max_size=251).filter(
    lambda b: b"/" not in b and b"\0" not in b and not b.startswith(b".")
)


def spelt(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + raw.hex()
    return text if text.isprintable() and not text.startswith("hex:") else "hex:" + raw.hex()


@given(st.binary(max_size=300))
def test_to_source_is_one_to_one_and_printable(raw: bytes) -> None:
    source = names.to_source(raw)
    assert source == spelt(raw)
    assert source.isprintable()
    assert names.to_raw(source) == raw


@given(st.text(max_size=50))
def test_inside_means_relative_without_parent_parts(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    escapes = not raw or raw.startswith(b"/") or b".." in raw.split(b"/") or b"\0" in raw
    assert names.is_inside(names.to_source(raw)) is not escapes


CONFIG = """\
source: {kind: folder, path: src, split: {val: 0.0}}
stages:
  - decode: {mode: L}
  - resize: {size: [4, 4], mode: stretch, filter: nearest}
output: {dir: out}
run: {backend: sequential}
"""


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(component, min_size=1, max_size=6, unique=True))
def test_any_file_name_round_trips(parts: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        folder = os.fsencode(base / "src" / "cls")
        os.makedirs(folder)
        written: dict[str, int] = {}
        for i, part in enumerate(parts):
            raw = part + b".png"
            buffer = io.BytesIO()
            Image.new("L", (4, 4), i * 40).save(buffer, "PNG")
            with open(folder + b"/" + raw, "wb") as f:
                f.write(buffer.getvalue())
            written[spelt(b"cls/" + raw)] = i * 40
        (base / "pipeline.yaml").write_text(CONFIG)
        config = load_config(base / "pipeline.yaml")

        report = pipeline.run(config)
        assert report.packed_new == len(parts) and report.rejected == 0

        with ipc.open_file(base / "out" / "versions" / "v000001" / "manifest.arrow") as f:
            table = f.read_all()
        assert sorted(table.column("source").to_pylist()) == sorted(written)

        checked = audit(base / "out", AuditOptions(source_root=base / "src"))
        assert checked.clean, [f.message for f in checked.findings]
        assert checked.sources_checked == len(parts)

        dataset = open_dataset(base / "out")
        for sample_id, source in zip(
            table.column("sample_id").to_pylist(), table.column("source").to_pylist(), strict=True
        ):
            pixels = np.asarray(dataset.image(sample_id))
            assert (pixels == written[source]).all(), source
