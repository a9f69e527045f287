"""The documentation stays true to the code: the README is a front door under 250 lines, every
relative link lands on a file, and the reject-reason table lists exactly the reasons the code
can give."""

from __future__ import annotations

import re
from pathlib import Path

from etl.images.rejects import REJECT_REASONS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_every_relative_link_lands_on_a_file() -> None:
    checked = 0
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"
            checked += 1
    assert checked > 10


def test_the_reject_table_lists_exactly_the_reasons_the_code_gives() -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    table = text[text.index("| reason | what it means |") :].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.strip().startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(REJECT_REASONS)
