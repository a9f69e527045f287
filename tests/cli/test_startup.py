"""What a command imports: pyarrow's first array must not pull in pandas (0.5-0.8 s of a small
run), and pandas must still work for whoever asks pyarrow for it afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from etl.start.sample_data import make_sample_data

RUN_AND_REPORT = """
import json, sys
from etl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "pandas": "pandas" in sys.modules}), file=sys.stderr)
"""


def test_a_run_never_imports_pandas(tmp_path: Path) -> None:
    make_sample_data(tmp_path / "data", per_class=3, seed=2)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(tmp_path / 'data'))}}}\n"
        "stages: [{decode: {mode: RGB}}, {resize: {size: [16, 16]}}]\n"
        f"output: {{dir: {json.dumps(str(tmp_path / 'out'))}}}\n"
        "run: {n_jobs: 1}\n"
    )
    for args in (["run", str(config), "--json"], ["inspect", str(tmp_path / "out")]):
        done = subprocess.run(
            [sys.executable, "-c", RUN_AND_REPORT, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        status = json.loads(done.stderr.strip().splitlines()[-1])
        assert status == {"code": 0, "pandas": False}, (args, done.stderr)


PANDAS_AFTER = """
import sys
from etl.cli import _arrow_without_pandas
_arrow_without_pandas()
import pyarrow as pa
assert "pandas" not in sys.modules
frame = pa.table({"a": [3, 1]}).to_pandas()
import pandas as pd
assert isinstance(frame, pd.DataFrame) and frame["a"].tolist() == [3, 1]
array = pa.array(pd.Series(["x", "y", "x"], dtype="category"))
assert pa.types.is_dictionary(array.type), array.type
assert pa.Table.from_pandas(frame).column("a").to_pylist() == [3, 1]
print("ok")
"""


def test_pandas_still_works_after_the_guard() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PANDAS_AFTER], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr
