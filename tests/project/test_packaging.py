"""The layers install apart (pyproject.toml's extras): a training node imports the format and
the loaders without the ETL's packages, a packing node never imports torch, and the `etl`
command without its packages says in one line how to get them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from etl.cli import ETL_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml"}
"""Distribution -> top-level module, where the two differ."""


def imported_by(code: str) -> set[str]:
    """Top-level modules a fresh interpreter has imported after `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return {name.split(".")[0] for name in json.loads(proc.stdout)}


def test_the_etl_extra_is_what_the_cli_checks_for() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in extras["optional-dependencies"]["etl"]}
    assert {IMPORT_NAMES.get(n, n) for n in names} == ETL_PACKAGES
    core = {re.split(r"[<>=\[ ]", d)[0].lower() for d in extras["dependencies"]}
    assert core == {"numpy", "pyarrow", "xxhash", "blake3"}  # the format, nothing more


def test_a_training_node_needs_only_the_format_and_torch() -> None:
    found = imported_by("import loaders\nfrom loaders import open_catalog, PackedDataset")
    assert "torch" in found
    assert not found & ETL_PACKAGES, found & ETL_PACKAGES


def test_a_packing_node_never_imports_torch() -> None:
    code = (
        "import etl.cli, etl.run.pipeline, etl.maintenance.checkup, etl.explore.view\n"
        "import contextlib, io\nfrom etl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    )
    assert "torch" not in imported_by(code)


def test_the_cli_without_its_packages_says_how_to_install_them() -> None:
    code = "import sys\nsys.modules['typer'] = None\nfrom etl.cli import main\nmain(['--help'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "error: the etl command needs the ETL packages (typer is missing): "
        "pip install 'etl-memmap[etl]'"
    )
