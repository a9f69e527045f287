"""The dataset report: one self-contained HTML file per version (`etl report`).

Everything is inline (SVG charts, JPEG data URIs), so the file opens from disk or a CI
artifact with no server and no network; its Content-Security-Policy forbids every external
resource and every script. The page is a Jinja2 template with autoescaping on: a class name,
a file name, a reject message or a column value is always text, never markup. The same
version, seed and flags give the same bytes (`etl.report.contents` reads no clock).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from jinja2 import Environment, PackageLoader, StrictUndefined

from etl.explore.dataset import Dataset
from etl.format.atomic import replacing
from etl.progress import Progress
from etl.report.contents import ReportData, gather
from etl.report.history import TIMELINE_DIFFS

if TYPE_CHECKING:
    from etl.config import DecodeStage, SourceConfig


def render(data: ReportData) -> str:
    """The report's HTML."""
    env = Environment(
        loader=PackageLoader("etl.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    template = env.get_template("report.html.j2")
    return template.render(r=data, limits={"timeline": TIMELINE_DIFFS})


def write_report(
    ds: Dataset,
    path: Path,
    seed: int = 0,
    source: SourceConfig | None = None,
    decode: DecodeStage | None = None,
    progress: Progress | None = None,
) -> ReportData:
    """Write the report of `ds`'s version to `path` (through a temp file and a rename, so a
    reader never sees half a page) and return what it shows."""
    data = gather(ds, seed, source, decode, progress)
    page = render(data)
    with replacing(path) as temp:
        Path(temp).write_text(page, encoding="utf-8")
    return data
