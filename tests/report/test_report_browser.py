"""The report in a real browser: Debian's Chromium, headless, driven by Playwright (PyPI's
`playwright`, its own browser download never used), the page opened from a file URL with the
network off. It must render with no request but its own file, no console message, no dialog
(a hostile name that ran would `alert`), every section and chart drawn, and a screenshot.

Where Chromium is not installed the tests skip with one line; with ETL_REQUIRE_BROWSER set (as
.ci/run sets it) they fail instead, so CI never skips them."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.report import (
    HOSTILE_CAPTION,
    HOSTILE_CLASS,
    HOSTILE_FILE,
    HOSTILE_REJECT,
    pack_versions,
)

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",  # the tests run as root here; Chromium's sandbox refuses root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SECTIONS = (
    "overview",
    "classes",
    "rejects",
    "samples",
    "columns",
    "storage",
    "versions",
    "changes",
    "config",
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def browser() -> object:
    missing = None
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        missing = f"no browser at {CHROMIUM}: apt-get install chromium (Debian's package)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            missing = "playwright is not installed: pip install -e '.[dev]'"
    if missing is not None:
        if os.environ.get("ETL_REQUIRE_BROWSER"):
            pytest.fail(f"CI runs the browser tests: {missing}")
        pytest.skip(missing)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from etl.cli import main

    root = tmp_path_factory.mktemp("browser")
    config = pack_versions(root)
    out = root / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", str(root / "out"), "-o", str(out), "--config", str(config), "-q"])
    assert done.value.code in (0, None)
    return out


def test_the_report_renders_offline_with_no_request_no_message_and_no_script(
    browser: object, report: Path, tmp_path: Path
) -> None:
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    requests: list[str] = []
    messages: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: messages.append(f"error: {e}"))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(report.as_uri(), wait_until="load")

    assert [u for u in requests if not u.startswith("data:")] == [report.as_uri()]
    assert messages == []
    assert dialogs == []
    assert page.locator("script").count() == 0
    for section in SECTIONS:
        assert page.locator(f"section#{section} h2").is_visible(), section
    bars = page.locator("#class-chart rect")
    assert bars.count() >= 3 and page.locator("#reject-chart rect").count() >= 2
    assert page.locator("svg.histogram rect").count() > 0
    box = page.locator("#class-chart").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 40
    # every thumbnail decoded: a broken data URI has no natural size
    sizes = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
    assert sizes and all(done and width > 0 for done, width in sizes)
    text = page.inner_text("body")
    for hostile in (HOSTILE_CLASS, HOSTILE_FILE, HOSTILE_CAPTION, HOSTILE_REJECT):
        assert hostile in text, hostile

    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=False)
    pixels = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"))
    assert pixels.shape == (900, 1100, 3) and pixels.std() > 20  # drawn, not a blank page
    context.close()


def test_the_sample_data_report_renders_and_is_the_docs_screenshot(
    browser: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report of `etl sample-data` packed twice (a class relabelled, files added and
    removed between): what docs/img/report.png shows. With ETL_REPORT_SCREENSHOT=PATH the
    screenshot is written there (docs/inspecting.md says how it is made)."""
    from etl.cli import main
    from etl.start.sample_data import make_sample_data

    keep = os.environ.get("ETL_REPORT_SCREENSHOT")
    target = Path(keep).resolve() if keep else None
    make_sample_data(tmp_path / "data", per_class=12, seed=0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipeline.yaml").write_text(SAMPLE_CONFIG)
    for step in range(2):
        if step:  # version 2: two files gone, one added
            for old in sorted((tmp_path / "data" / "circle").iterdir())[:2]:
                old.unlink()
            (tmp_path / "data" / "square" / "added.png").write_bytes(_square_png())
        args = ["run", "pipeline.yaml", "-q"] + (["--report", "report.html"] if step else [])
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code in (0, None)
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 1400})  # type: ignore[attr-defined]
    page = context.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(m.text))
    page.goto((tmp_path / "report.html").as_uri(), wait_until="load")
    assert messages == []
    assert page.locator("#timeline > tbody > tr").count() == 2
    shot = tmp_path / "shot.png"
    page.screenshot(path=str(shot))
    if target is not None:
        shutil.copyfile(shot, target)
    context.close()


SAMPLE_CONFIG = """\
source: {kind: folder, path: data}
stages:
  - decode: {}
  - validate: {min_size: [16, 16], duplicates: keep_first}
  - resize: {size: [64, 64]}
output: {dir: artifacts, samples_per_shard: 32}
run: {backend: sequential}
"""


def _square_png() -> bytes:
    array = np.zeros((80, 80, 3), np.uint8)
    array[20:60, 20:60] = (240, 200, 40)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()
