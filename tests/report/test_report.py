"""`etl report` on a dataset packed by real runs, read back with the standard library's HTML
parser and checked against independent reads: pyarrow for the manifests, numpy for the shards,
Pillow for the thumbnails. (The same page in a real browser: test_report_browser.py.)"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from PIL import Image

from tests.helpers.cli import cli
from tests.helpers.report import (
    HOSTILE_CAPTION,
    HOSTILE_CLASS,
    HOSTILE_FILE,
    HOSTILE_REJECT,
    pack_versions,
)


class Page(HTMLParser):
    """Every element (tag, attributes), the text of each element with an id, and all text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.by_id: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self.elements.append((tag, found))
        if "id" in found:
            self.by_id[found["id"]] = []
            self._open.append(found["id"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        for ident in self._open:
            self.by_id[ident].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("section", "table", "svg") and self._open:
            self._open.pop()

    def tags(self, name: str) -> list[dict[str, str]]:
        return [attrs for tag, attrs in self.elements if tag == name]


def manifest(out: Path, version: int, name: str = "manifest.arrow") -> ipc.RecordBatchFileReader:
    return ipc.open_file(out / "versions" / f"v{version:06d}" / name)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    pack_versions(root)
    return root


@pytest.fixture(scope="module")
def page(packed: Path) -> tuple[str, Page]:
    from etl.cli import main

    out = packed / "report.html"
    with pytest.raises(SystemExit) as done:
        main(
            [
                "report",
                str(packed / "out"),
                "-o",
                str(out),
                "--config",
                str(packed / "pipeline.yaml"),
                "-q",
            ]
        )
    assert done.value.code in (0, None)
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


def _jpeg(uri: str) -> Image.Image:
    assert uri.startswith("data:image/jpeg;base64,")
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


def test_the_page_is_self_contained_and_forbids_everything_external(page: tuple[str, Page]) -> None:
    text, html = page
    csp = [m for m in html.tags("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp and csp[0]["content"].startswith("default-src 'none'")
    assert "img-src data:" in csp[0]["content"]
    assert html.tags("script") == [] and html.tags("link") == [] and html.tags("iframe") == []
    for tag, attrs in html.elements:
        for key in ("src", "href", "srcset", "action", "data"):
            if key in attrs:
                value = attrs[key]
                assert value.startswith("data:image/jpeg;base64,") or value.startswith("#"), (
                    tag,
                    value,
                )
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    assert "url(" not in text and "@import" not in text


def test_hostile_names_and_values_stay_text(page: tuple[str, Page]) -> None:
    text, html = page
    shown = "".join(html.text)
    for hostile in (HOSTILE_CLASS, HOSTILE_FILE, HOSTILE_CAPTION, HOSTILE_REJECT):
        assert hostile in shown, hostile  # read back as text by the parser
        assert hostile not in text  # never as raw markup in the file
    assert html.tags("img") and all(set(a) <= {"src", "alt"} for a in html.tags("img"))


def test_counts_per_split_and_class_match_the_manifest(
    packed: Path, page: tuple[str, Page]
) -> None:
    table = manifest(packed / "out", 2).read_all()
    classes = json.loads(manifest(packed / "out", 2).schema.metadata[b"etl.classes"])
    expected = Counter(
        zip(table.column("class_name").to_pylist(), table.column("split").to_pylist(), strict=True)
    )
    _, html = page
    cells = [c.strip() for c in html.by_id["class-table"] if c.strip()]
    header_end = cells.index("total")
    splits = cells[2:header_end]
    body = cells[header_end + 1 :]
    width = 2 + len(splits) + 1
    rows = [body[i : i + width] for i in range(0, len(body), width)]
    assert [r[1] for r in rows] == classes
    for row in rows:
        for split, n in zip(splits, row[2:-1], strict=True):
            assert int(n.replace(",", "")) == expected[(row[1], split)]
        assert int(row[-1]) == sum(v for (c, _), v in expected.items() if c == row[1])
    bars = [t for t in html.tags("rect")]
    assert len(bars) >= len(classes)


def test_thumbnails_are_the_stored_pixels(packed: Path, page: tuple[str, Page]) -> None:
    """A grid thumbnail, decoded by Pillow, is the sample read from its shard with numpy."""
    out = packed / "out"
    rows = {r["sample_id"]: r for r in manifest(out, 2).read_all().to_pylist()}
    _, html = page
    checked = 0
    for img in html.tags("img"):
        sample_id = img["alt"].split(" ")[0]
        if sample_id not in rows:
            continue
        row = rows[sample_id]
        pixels = np.load(out / row["shard"], mmap_mode="r")[row["row"]]
        shown = np.asarray(_jpeg(img["src"]).convert("RGB"), dtype=np.int16)
        assert shown.shape == (96, 96, 3)  # 24 px grown by whole factors
        expected = np.repeat(np.repeat(pixels, 4, axis=0), 4, axis=1).astype(np.int16)
        assert np.abs(shown - expected).mean() < 4
        checked += 1
    assert checked >= 3


def test_rejects_by_reason_with_thumbnails_where_decodable(
    packed: Path, page: tuple[str, Page]
) -> None:
    rejects = manifest(packed / "out", 2, "rejects.arrow").read_all().to_pylist()
    by_reason = Counter(r["reason"] for r in rejects)
    _, html = page
    shown = "".join(html.text)
    for reason, n in by_reason.items():
        assert f"{reason}: {n}" in shown
    for r in rejects:
        assert r["source"] in shown and r["message"] in shown
    # tiny.png decodes (rejected as too small): its thumbnail is there; the text file is not
    alts = [i["alt"] for i in html.tags("img")]
    assert any("tiny.png" in a for a in alts)
    assert not any(HOSTILE_REJECT in a for a in alts)


def test_timeline_and_changes_match_an_independent_diff(
    packed: Path, page: tuple[str, Page]
) -> None:
    out = packed / "out"
    old, new = ({r["source"]: r for r in manifest(out, v).read_all().to_pylist()} for v in (1, 2))
    added, removed = set(new) - set(old), set(old) - set(new)
    changed = {s for s in set(old) & set(new) if old[s]["class_name"] != new[s]["class_name"]}
    _, html = page
    timeline = " ".join(c.strip() for c in html.by_id["timeline"] if c.strip())
    assert f"+{len(added)} -{len(removed)} ~{len(changed)} (since v1)" in timeline
    assert "first version" in timeline
    alts = [i["alt"] for i in html.tags("img")]
    for source in added | changed:
        assert any(a.startswith(source) for a in alts), source
    assert {"p05.png", "p20.png", "p04.png"} == removed | added | changed


def test_column_summaries(packed: Path, page: tuple[str, Page]) -> None:
    table = manifest(packed / "out", 2).read_all()
    _, html = page
    shown = "".join(html.text)
    scores = [s for s in table.column("score").to_pylist() if s is not None]
    titles = re.findall(r"<title>([^<]*?): (\d+)</title>", page[0])
    hist = [int(n) for t, n in titles if " to " in t]
    boxes = [b for b in table.column("boxes").to_pylist() if b is not None]
    assert sum(hist) == len(scores) + len(boxes)  # the score bins, then the boxes' lengths
    captions = Counter(c for c in table.column("caption").to_pylist() if c is not None)
    top, count = captions.most_common(1)[0]
    assert f"{top}{count}" in shown.replace("\n", "")
    assert f"{len(captions):,} distinct" in shown


def test_the_same_version_and_seed_give_the_same_bytes(
    packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [packed / f"again{i}.html" for i in range(2)]
    for path, seed in zip(paths, (7, 7), strict=True):
        code, _, err = cli(
            ["report", str(packed / "out"), "-o", str(path), "--seed", str(seed), "-q"], capsys
        )
        assert code == 0, err
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_a_pinned_first_version_has_no_changes(
    packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = packed / "v1.html"
    code, out, _ = cli(["report", str(packed / "out"), "--version", "1", "-o", str(path)], capsys)
    assert code == 0 and "report of version 1" in out
    text = "".join(Page(path.read_text()).text)
    assert "is the first: nothing to compare with" in text
    assert "thumbnails not available: give the source" in text  # no --config, no --source


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "{tmp}/report.png"], "end the name in .html"),
        (["-o", "{tmp}/missing/report.html"], "no such folder"),
        (["--version", "9", "-o", "{tmp}/r.html"], "9"),
        (["--seed", "-1", "-o", "{tmp}/r.html"], "--seed"),
    ],
)
def test_bad_arguments_are_one_line(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = cli(["report", str(packed / "out"), *args], capsys)
    assert code != 0 and message in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.html"))


def test_a_page_that_cannot_be_written_there_is_one_line(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o` naming a folder (the rename over it fails) for the report and for `etl show`:
    exit code 2 and one line naming it, never an OSError's traceback, no temp file left."""
    from etl.cli import main

    for command, name in (("report", "page.html"), ("show", "sheet.png")):
        taken = tmp_path / command / name
        taken.mkdir(parents=True)
        with pytest.raises(SystemExit) as done:
            main([command, str(packed / "out"), "-o", str(taken)])
        err = capsys.readouterr().err
        assert done.value.code == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and str(taken) in err, err
        assert [p.name for p in taken.parent.iterdir()] == [name]


def test_not_a_dataset_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(["report", str(tmp_path), "-o", str(tmp_path / "r.html")], capsys)
    assert code != 0 and str(tmp_path) in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_etl_run_report_writes_it_and_records_the_command(tmp_path: Path) -> None:
    from tests.helpers.report import CONFIG, write_photos

    write_photos(tmp_path / "photos", 1)
    (tmp_path / "pipeline.yaml").write_text(CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", "pipeline.yaml", "--report", "r.html"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote r.html" in done.stdout
    command = json.loads(manifest(tmp_path / "out", 1).schema.metadata[b"etl.command"])
    assert command == "etl run pipeline.yaml --report r.html"
    text = "".join(Page((tmp_path / "r.html").read_text()).text)
    assert command in text
    assert "thumbnails not available" not in text  # the run's own source gives them


def test_the_seed_draws_the_samples_and_the_bounds_say_what_is_left_out(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fewer thumbnails allowed than the dataset has, each class shows a seeded few, and
    the page says which classes and rejects it left out."""
    from etl.explore.dataset import open_dataset
    from etl.report import contents as report_data

    monkeypatch.setattr(report_data, "PER_CLASS", 2)
    monkeypatch.setattr(report_data, "REJECT_BUDGET", 1)
    ds = open_dataset(packed / "out")
    grids = {seed: report_data.gather(ds, seed=seed).grid for seed in range(4)}
    table = manifest(packed / "out", 2).read_all()
    ids_of = Counter(table.column("class_name").to_pylist())
    for grid in grids.values():
        for name, thumbs in grid:
            assert len(thumbs) == min(2, ids_of[name])
    assert len({tuple(t.lines for _, ts in g for t in ts) for g in grids.values()}) > 1
    data = report_data.gather(ds, seed=0)
    assert sum(len(g.examples) for g in data.reject_groups) == 1
    monkeypatch.setattr(report_data, "GRID_BUDGET", 2)
    monkeypatch.setattr(report_data, "CHART_CLASSES", 2)
    data = report_data.gather(ds, seed=0)
    assert len(data.grid) == 2 and data.notes["grid"] == "the grid shows the first 2 of 3 classes"
    assert (
        len(data.classes_chart.bars) == 2 and "1 largest and the 1 smallest" in data.notes["chart"]
    )


def test_reasons_are_capped_and_long_text_is_cut_with_a_mark(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past REJECT_REASONS reasons the page charts and groups the most common and says how
    many there were; a value past TEXT_CHARS characters shows its start and how much was cut."""
    from etl.explore.dataset import open_dataset
    from etl.report import contents as report_data

    ds = open_dataset(packed / "out")
    reasons = Counter(ds.rejects.column("reason").to_pylist())
    assert len(reasons) >= 2
    monkeypatch.setattr(report_data, "REJECT_REASONS", 1)
    monkeypatch.setattr(report_data, "TEXT_CHARS", 12)
    data = report_data.gather(ds, seed=0)
    (group,) = data.reject_groups
    top = max(reasons.values())
    assert group.reason == min(r for r, n in reasons.items() if n == top)  # ties by value
    assert group.count == top
    assert data.notes["reasons"] == f"the report shows the 1 most common of {len(reasons)} reasons"
    assert len(data.reject_chart.bars) == 1
    for source, message, _ in group.examples:
        for text in (source, message):
            head, _, rest = text.partition("... (")
            assert len(head) <= 12 and (not rest or rest.endswith(" more characters)")), text
    assert any("more characters)" in m for _, m, _ in group.examples)


def test_a_missing_shard_is_said_in_place_of_its_thumbnails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged dataset still gets its report: the samples of a deleted shard say why they
    have no picture; every other section is there."""
    pack_versions(tmp_path)
    shards = sorted((tmp_path / "out" / "shards").glob("*.npy"))
    shards[0].unlink()
    path = tmp_path / "damaged.html"
    code, _, err = cli(["report", str(tmp_path / "out"), "-o", str(path), "-q"], capsys)
    assert code == 0, err
    html = Page(path.read_text())
    text = "".join(html.text)
    assert f"not available: {shards[0]}" in text
    assert html.tags("img")  # the other shards' samples are drawn
