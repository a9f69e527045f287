from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etl.cli import main
from etl.start.sample_data import make_sample_data
from tests.helpers.cli import cli


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), captured.out, captured.err


@pytest.fixture
def project(tmp_path: Path) -> Path:
    make_sample_data(tmp_path / "data" / "sample", per_class=4, seed=1)
    text = (Path(__file__).parents[2] / "pipeline.yaml").read_text()
    (tmp_path / "pipeline.yaml").write_text(text.replace("n_jobs: -1", "n_jobs: 1"))
    return tmp_path


@pytest.mark.parametrize("command", [[], ["run"], ["validate"], ["sample-data"]])
def test_help_shows_an_example(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert "Example:" in out and "etl " in out


def test_run_json_then_unchanged(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["run", str(project / "pipeline.yaml"), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["committed"] and report["version"] == 1
    assert report["packed_new"] + report["rejected"] == report["listed"]
    assert report["rejects_by_reason"]["truncated"] == 2
    code, out, _ = run_cli(["run", str(project / "pipeline.yaml")], capsys)
    assert code == 0 and "unchanged" in out and "nothing changed since version 1" in out


def test_dry_run_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["run", str(project / "pipeline.yaml"), "--dry-run", "-v"], capsys)
    assert code == 0
    assert "plan for version 1" in out and "pack   circle/" in out and "reject " in out
    assert not (project / "artifacts").exists()


def test_validate(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["validate", str(project / "pipeline.yaml")], capsys)
    assert code == 0 and ": ok (" in out


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("size: [64, 64]", "size: [64]", "pipeline.yaml:{line}: stages[2].resize.size[1]"),
        ("path: data/sample", "path: nowhere", "source.path"),
        ("layout: HWC", "layout: WHC", "pipeline.yaml:{line}: output.layout"),
        ("n_jobs: 1", "n_jobs: 1\n  colour: red", "pipeline.yaml:{line}: run.colour: unknown key"),
    ],
)
def test_user_mistakes_are_one_line_with_exit_2(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    path = project / "pipeline.yaml"
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if old in text) + new.count("\n")
    path.write_text(path.read_text().replace(old, new))
    for command in ("validate", "run"):
        code, out, err = run_cli([command, str(path)], capsys)
        assert code == 2, (out, err)
        assert expected.format(line=line) in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_sample_data_refuses_non_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    code, _, err = run_cli(["sample-data", str(tmp_path / "d")], capsys)
    assert code == 2 and "not empty" in err


def test_python_dash_m(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "etl", "validate", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path / 'missing.yaml'}: no such config file"


@pytest.mark.parametrize("command", ["show", "sample-data", "view"])
def test_a_negative_seed_is_a_usage_error_not_a_traceback(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli([command, str(tmp_path / "x"), "--seed", "-1"], capsys)
    assert code == 2 and "--seed" in err and "Traceback" not in err
