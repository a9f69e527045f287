"""`etl init`, `etl inspect` and `etl show`, driven in-process on datasets packed by real runs.

Expected values come from independent reads: pyarrow.ipc for manifests, np.load(mmap_mode="r")
for shards, Pillow for the PNGs, PyYAML for the written config.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from etl.cli import main
from etl.config import (
    DecodeStage,
    FolderSource,
    OutputConfig,
    ResizeStage,
    RunConfig,
    ValidateStage,
    load_config,
)
from etl.config.stages import KEEP_ASPECT_KEYS
from etl.run import pipeline
from etl.start import scaffold, survey
from etl.start.sample_data import CLASSES, make_sample_data


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), captured.out, captured.err


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder: data/sample, pipeline.yaml (the repository's, small shards) and
    artifacts/ (version 1)."""
    root = tmp_path_factory.mktemp("project")
    make_sample_data(root / "data" / "sample", per_class=4, seed=1)
    text = (Path(__file__).parents[2] / "pipeline.yaml").read_text()
    text = text.replace("n_jobs: -1", "n_jobs: 1").replace("backend: auto", "backend: sequential")
    text = text.replace("shard_size: 4MiB", "samples_per_shard: 6").replace("val: 0.1", "val: 0.3")
    (root / "pipeline.yaml").write_text(text)
    assert pipeline.run(load_config(root / "pipeline.yaml")).committed
    return root


def manifest_rows(dataset: Path, version: int = 1) -> list[dict]:
    with ipc.open_file(dataset / "versions" / f"v{version:06d}" / "manifest.arrow") as f:
        return f.read_all().to_pylist()


def stored(dataset: Path, row: dict) -> np.ndarray:
    return np.load(dataset / row["shard"], mmap_mode="r")[row["row"]]


def upscaled(array_hwc: np.ndarray, factor: int) -> np.ndarray:
    return array_hwc.repeat(factor, axis=0).repeat(factor, axis=1)


# --- every command ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["init", "inspect", "show"])
def test_help_shows_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    assert "Example:" in out and f"etl {command} " in out


def test_shell_completion_script_and_completions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: without this, Typer detects the shell that started pytest (shellingham) and takes
    # "bash" for an argument: `sh -c "pytest ..."`, as make runs a recipe with quotes, fails.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    code, out, _ = run_cli(["--show-completion", "bash"], capsys)
    assert code == 0 and "_etl_completion" in out and "complete " in out
    monkeypatch.setenv("_ETL_COMPLETE", "complete_bash")
    for words, cword, expected in [("etl ins", "1", "inspect"), ("etl show --cl", "2", "--class")]:
        monkeypatch.setenv("COMP_WORDS", words)
        monkeypatch.setenv("COMP_CWORD", cword)
        code, out, _ = run_cli([], capsys)
        assert code == 0 and expected in out.split(), out


# --- init -------------------------------------------------------------------------------------


def test_init_writes_a_config_that_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_sample_data(tmp_path / "data", per_class=4, seed=2)
    config_path = tmp_path / "pipeline.yaml"
    code, out, err = run_cli(["init", str(tmp_path / "data"), "--output", str(config_path)], capsys)
    assert code == 0, err
    assert f"wrote {config_path}" in out
    text = config_path.read_text()

    # the classes found, with their counts, as comments
    images = {".jpg", ".jpeg", ".png", ".gif"}  # what make_sample_data writes, besides junk
    on_disk = {
        c: sum(p.suffix.lower() in images for p in (tmp_path / "data" / c).iterdir())
        for c in CLASSES
    }
    for name, n in on_disk.items():
        assert re.search(rf"^#\s+{name}\s+{n}$", text, re.M), name
    assert f"# classes: [{', '.join(sorted(CLASSES))}]" in text

    # every key of the schema is written out (classes as a comment), with the model's default
    raw = yaml.safe_load(text)
    stages = {next(iter(s)): s[next(iter(s))] for s in raw["stages"]}
    for section, model in [
        (raw["source"], FolderSource),
        (stages["decode"], DecodeStage),
        (stages["validate"], ValidateStage),
        (stages["resize"], ResizeStage),
        (raw["output"], OutputConfig),
        (raw["run"], RunConfig),
    ]:
        expected = (
            set(model.model_fields) - {"kind"} - ({"classes"} if model is FolderSource else set())
        )
        if model is ResizeStage:  # keep_aspect's keys and draft (unset): written as comments
            expected -= {*KEEP_ASPECT_KEYS, "draft"}
            assert all(f"{key}: " in text for key in (*KEEP_ASPECT_KEYS, "draft"))
        assert expected <= set(section), (model.__name__, expected - set(section))
    config = load_config(config_path)
    assert config.decode == DecodeStage() and config.validate_stage == ValidateStage()
    assert config.resize == ResizeStage(size=config.resize.size)
    assert config.run == RunConfig() and config.source.split == FolderSource(path=Path()).split
    assert config.output.layout == OutputConfig().layout
    assert config.samples_per_shard == (256 << 20) // config.sample_bytes  # the default rule
    assert config.output.dir == tmp_path / "artifacts"

    # ... and `etl run` accepts it as is
    report = pipeline.run(config)
    assert report.committed and report.samples_total > 0
    assert report.samples_total + report.rejected == report.listed


def test_init_suggests_a_size_from_the_median_shorter_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, (name, size) in enumerate([("a", (150, 100)), ("a", (300, 90)), ("b", (120, 80))]):
        (tmp_path / "src" / name).mkdir(parents=True, exist_ok=True)
        Image.new("L", size, 40).save(tmp_path / "src" / name / f"{i}.png")
    (tmp_path / "src" / "stray.jpg").write_bytes(b"not in a class folder")
    code, _, err = run_cli(["init", str(tmp_path / "src"), "-o", str(tmp_path / "p.yaml")], capsys)
    assert code == 0, err
    config = load_config(tmp_path / "p.yaml")
    assert config.resize.size == (64, 64)  # shorter sides 100, 90, 80: median 90 -> 64
    assert config.decode.mode == "L"  # every image is grey
    text = (tmp_path / "p.yaml").read_text()
    assert "median shorter side 90 px -> size 64" in text and "1 file(s) are outside" in text


@pytest.mark.parametrize(
    "side", [1, 31, 32, 33, 63, 64, 100, 127, 128, 200, 223, 224, 255, 256, 5000]
)
def test_suggest_size(side: int) -> None:
    size = survey.suggest_size(side)
    assert size in survey.SIZES
    if side >= survey.SIZES[0]:
        assert size <= side and all(s > side for s in survey.SIZES if s > size)
    else:
        assert size == survey.SIZES[0]


def test_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_sample_data(tmp_path / "data", per_class=1, seed=0, broken=False)
    target = tmp_path / "pipeline.yaml"
    target.write_text("# mine\n")
    code, _, err = run_cli(["init", str(tmp_path / "data"), "-o", str(target)], capsys)
    assert code == 2 and "exists already; pass --force" in err and len(err.splitlines()) == 1
    assert target.read_text() == "# mine\n"
    code, _, err = run_cli(["init", str(tmp_path / "data"), "-o", str(target), "--force"], capsys)
    assert code == 0, err
    assert load_config(target).source.path == tmp_path / "data"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_init_inside_the_source_puts_the_output_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_sample_data(tmp_path / "data", per_class=1, seed=0, broken=False)
    target = tmp_path / "data" / "pipeline.yaml"
    code, _, err = run_cli(["init", str(tmp_path / "data"), "-o", str(target)], capsys)
    assert code == 0, err
    config = load_config(target)
    assert config.source.path == tmp_path / "data"
    assert config.output.dir == tmp_path / "data-artifacts"
    pipeline.check_paths(config)


def test_uncommented_classes_pin_the_label_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(40):  # enough class names to wrap the commented list over several lines
        (tmp_path / "src" / f"class-number-{i:03d}").mkdir(parents=True)
        Image.new("RGB", (40, 40)).save(tmp_path / "src" / f"class-number-{i:03d}" / "x.png")
    run_cli(["init", str(tmp_path / "src"), "-o", str(tmp_path / "p.yaml")], capsys)
    lines = (tmp_path / "p.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  # classes: ["))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith("]"))
    assert end > start  # wrapped
    for i in range(start, end + 1):
        lines[i] = (
            lines[i].replace("  # ", "  ", 1) if i == start else lines[i].replace("#", " ", 1)
        )
    (tmp_path / "p.yaml").write_text("\n".join(lines) + "\n")
    config = load_config(tmp_path / "p.yaml")
    assert config.source.classes == tuple(f"class-number-{i:03d}" for i in range(40))


def test_init_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["init", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "not a folder" in err
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    code, _, err = run_cli(["init", str(tmp_path / "empty")], capsys)
    assert code == 2 and "no images inside class folders" in err


# --- inspect ----------------------------------------------------------------------------------


def test_inspect_json_and_plot(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = packed / "artifacts"
    plot = tmp_path / "balance.png"
    code, out, err = run_cli(["inspect", str(dataset), "--json", "--plot", str(plot)], capsys)
    assert code == 0, err
    report = json.loads(out)
    rows = manifest_rows(dataset)
    found = Counter((r["split"], r["class_name"]) for r in rows)
    assert report["samples"] == len(rows) and report["version"] == 1 and report["versions"] == [1]
    for split, per_class in report["counts"].items():
        assert per_class == {c: found[(split, c)] for c in sorted(CLASSES)}
    with ipc.open_file(dataset / "versions" / "v000001" / "rejects.arrow") as f:
        reasons = Counter(f.read_all().column("reason").to_pylist())
    assert report["rejects_by_reason"] == dict(reasons) and report["rejects"] == reasons.total()
    shards = {r["shard"] for r in rows}
    assert report["shards"] == len(shards) > 1
    assert report["shard_bytes"] == sum((dataset / s).stat().st_size for s in shards)
    assert report["checksum"] == "xxh3_64" and report["layout"] == "HWC"
    assert report["config"]["split"] == {"val": 0.3} and report["plot"] == str(plot)

    image = Image.open(plot)
    assert image.format == "PNG" and image.width >= 320 and image.height >= 300
    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    colours = {tuple(p) for p in pixels[:: max(1, len(pixels) // 200_000)]}
    assert (0, 114, 178) in colours and (230, 159, 0) in colours  # train and val bars


def test_inspect_text(packed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["inspect", str(packed / "artifacts")], capsys)
    assert code == 0, err
    rows = manifest_rows(packed / "artifacts")
    assert f"samples  {len(rows)}:" in out and "checksum xxh3_64" in out
    assert (
        "- resize: {size: [64, 64]," in out
        and "split: {val: 0.3}" in out
        and "rejects" in out
        and "truncated 2" in out
    )
    for name in CLASSES:
        assert name in out


def test_inspect_a_pinned_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_sample_data(tmp_path / "data", per_class=2, seed=0, broken=False)
    (tmp_path / "p.yaml").write_text(
        "source: {kind: folder, path: data}\nstages: [{decode: {}}, {resize: {size: [16, 16]}}]\n"
        "output: {dir: out}\nrun: {backend: sequential}\n"
    )
    config = load_config(tmp_path / "p.yaml")
    pipeline.run(config)
    shutil.copy(
        next((tmp_path / "data" / "circle").iterdir()), tmp_path / "data" / "circle" / "z.png"
    )
    pipeline.run(config)
    code, out, _ = run_cli(["inspect", str(tmp_path / "out"), "--json", "--version", "1"], capsys)
    first = json.loads(out)
    code, out, _ = run_cli(
        ["inspect", str(tmp_path / "out" / "versions" / "v000002"), "--json"], capsys
    )
    second = json.loads(out)
    assert (first["version"], second["version"]) == (1, 2) and first["versions"] == [1, 2]
    assert second["samples"] == first["samples"] + 1 == len(manifest_rows(tmp_path / "out", 2))
    code, _, err = run_cli(["inspect", str(tmp_path / "out"), "--version", "7"], capsys)
    assert code == 2 and "no version 7; versions are [1, 2]" in err


def test_inspect_not_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["inspect", str(tmp_path)], capsys)
    assert code == 2 and "no manifest version found" in err and "Traceback" not in err


# --- show -------------------------------------------------------------------------------------


def show(
    dataset: Path, out: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[dict, np.ndarray]:
    code, stdout, err = run_cli(["show", str(dataset), "--out", str(out), "--json", *args], capsys)
    assert code == 0, err
    report = json.loads(stdout)
    image = Image.open(out)
    assert image.format == "PNG" and list(image.size) == report["size"]
    return report, np.asarray(image.convert("RGB"))


def check_cells(dataset: Path, report: dict, sheet: np.ndarray, factor: int = 2) -> None:
    """Every cell is the NEAREST-upscaled stored sample its sample id names."""
    by_id = {r["sample_id"]: r for r in manifest_rows(dataset, report["version"])}
    for cell in report["cells"]:
        left, top, right, bottom = cell["box"]
        row = by_id[cell["sample_id"]]
        assert (cell["class_name"], cell["split"]) == (row["class_name"], row["split"])
        expected = upscaled(stored(dataset, row), factor)
        np.testing.assert_array_equal(sheet[top:bottom, left:right], expected)


def test_show_random_samples(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = packed / "artifacts"
    report, sheet = show(dataset, tmp_path / "a.png", ["-n", "9", "--seed", "4"], capsys)
    assert len(report["cells"]) == 9 and report["kind"] == "samples"
    check_cells(dataset, report, sheet)
    boxes = [tuple(c["box"]) for c in report["cells"]]
    assert len({b[0] for b in boxes}) == 3 and len({b[1] for b in boxes}) == 3  # a 3x3 grid
    assert boxes == sorted(boxes, key=lambda b: (b[1], b[0]))  # row by row
    again, _ = show(dataset, tmp_path / "b.png", ["-n", "9", "--seed", "4"], capsys)
    other, _ = show(dataset, tmp_path / "c.png", ["-n", "9", "--seed", "5"], capsys)
    assert again["cells"] == report["cells"]
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert [c["sample_id"] for c in other["cells"]] != [c["sample_id"] for c in report["cells"]]


def test_show_filters(packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = packed / "artifacts"
    rows = manifest_rows(dataset)
    args = ["--class", "circle,square", "--split", "train", "-n", "100"]
    report, sheet = show(dataset, tmp_path / "f.png", args, capsys)
    expected = [
        r["sample_id"]
        for r in rows
        if r["class_name"] in ("circle", "square") and r["split"] == "train"
    ]
    assert [c["sample_id"] for c in report["cells"]] == expected  # all of them, manifest order
    check_cells(dataset, report, sheet)

    report, sheet = show(dataset, tmp_path / "v.png", ["--split", "val", "-n", "3"], capsys)
    assert len(report["cells"]) == 3 and {c["split"] for c in report["cells"]} == {"val"}
    check_cells(dataset, report, sheet)

    ids = [rows[5]["sample_id"], rows[0]["sample_id"], rows[9]["sample_id"]]
    report, sheet = show(dataset, tmp_path / "i.png", ["--ids", ",".join(ids)], capsys)
    assert [c["sample_id"] for c in report["cells"]] == ids
    check_cells(dataset, report, sheet)


def test_show_cell_size(packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = packed / "artifacts"
    report, sheet = show(dataset, tmp_path / "big.png", ["-n", "2", "--cell", "200"], capsys)
    check_cells(dataset, report, sheet, factor=3)  # 64 px samples grow x3 in 200 px cells
    report, _ = show(dataset, tmp_path / "row.png", ["-n", "5", "--columns", "5"], capsys)
    assert len({c["box"][1] for c in report["cells"]}) == 1


def test_show_default_output_and_text(
    packed: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["show", str(packed / "artifacts"), "-n", "4"], capsys)
    assert code == 0, err
    assert "wrote contact-sheet.png" in out and "4 samples of version 1, seed 0" in out
    assert Image.open(tmp_path / "contact-sheet.png").format == "PNG"


def test_show_rejects(packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = packed / "artifacts"
    with ipc.open_file(dataset / "versions" / "v000001" / "rejects.arrow") as f:
        rejects = f.read_all().to_pylist()
    for how in (
        ["--config", str(packed / "pipeline.yaml")],
        ["--source", str(packed / "data" / "sample")],
    ):
        report, sheet = show(dataset, tmp_path / "r.png", ["--rejects", "-n", "50", *how], capsys)
        assert report["kind"] == "rejects"
        assert [(c["source"], c["reason"]) for c in report["cells"]] == [
            (r["source"], r["reason"]) for r in rejects
        ]
        decoded = {c["reason"] for c in report["cells"] if c["decoded"]}
        assert {"too_small", "aspect", "duplicate"} <= decoded
        for cell in report["cells"]:
            left, top, right, bottom = cell["box"]
            if cell["reason"] == "too_small":  # 12x10 px: x10, NEAREST, exactly the source
                source = Image.open(packed / "data" / "sample" / cell["source"]).convert("RGB")
                expected = upscaled(np.asarray(source), 10)
                np.testing.assert_array_equal(sheet[top:bottom, left:right], expected)
            if cell["reason"] in ("truncated", "unreadable"):
                assert not cell["decoded"] and cell["note"]
                assert (right - left, bottom - top) == (128, 128)  # a placeholder cell
    report, _ = show(
        dataset,
        tmp_path / "t.png",
        ["--rejects", "--source", str(packed / "data" / "sample"), "--reason", "truncated"],
        capsys,
    )
    assert {c["reason"] for c in report["cells"]} == {"truncated"} and len(report["cells"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rejects"], "--rejects needs --source DIR or --config"),
        (["--class", "dog"], "no class ['dog']; classes: ['checker'"),
        (["--split", "holdout"], "no split ['holdout']"),
        (["--ids", "0000,1111"], "no sample with sample_id '0000'"),
        (["--ids", "x", "--class", "circle"], "drop --class and --split"),
        (["--reason", "truncated"], "go with --rejects"),
        (["--out", "sheet.jpg"], "end the name in .png"),
        (["--out", "missing/sheet.png"], "no such folder"),
    ],
)
def test_show_mistakes(
    packed: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["show", str(packed / "artifacts"), *args], capsys)
    assert code == 2 and message in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written, no temp file left


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30))
@example("...")  # a document end marker: YAML refuses it as a plain value
@example("---")
def test_yaml_values_read_back(text: str) -> None:
    assert yaml.safe_load(f"key: {scaffold.yaml_value(text)}") == {"key": text}
    values = [text, 1, 0.25, None, True, [text, 2]]
    assert yaml.safe_load(scaffold.yaml_value(values)) == values
