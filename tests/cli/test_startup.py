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


def test_every_command_is_found_by_its_own_module() -> None:
    """`COMMAND_MODULES` names, for every command the app has, the module that registers it."""
    from etl.cli import COMMAND_MODULES, _register
    from etl.cli.app import app

    _register([])
    registered = {
        command.name or command.callback.__name__: command.callback.__module__
        for command in app.registered_commands
        if command.callback is not None
    }
    assert {name: f"etl.cli.{module}" for name, module in COMMAND_MODULES.items()} == registered


ONLY_ITS_MODULE = """
import sys
from etl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
loaded = sorted(m for m in sys.modules if m.startswith("etl.cli.") and m != "etl.cli.app")
print(code, *loaded, file=sys.stderr)
"""


def test_a_command_imports_its_own_module_only(tmp_path: Path) -> None:
    """`etl audit DIR` loads neither `etl run`'s module nor the others (start-up time), and
    still runs as a command of the group, not as the app itself."""
    done = subprocess.run(
        [sys.executable, "-c", ONLY_ITS_MODULE, "audit", str(tmp_path / "nothing-here")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = done.stderr.strip().splitlines()[-1].split()
    assert last[:2] == ["2", "etl.cli.audit"], done.stderr
    assert not {"etl.cli.run", "etl.cli.inspect", "etl.cli.versions", "etl.cli.views"} & set(
        last
    ), done.stderr
    assert done.stderr.startswith(f"error: {tmp_path / 'nothing-here'}"), done.stderr
