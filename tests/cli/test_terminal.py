"""What the terminal is shown of someone's text: names the packer stores are spelt by the
format's rule already (`hex:...` for a name with a control character, docs/FORMAT.md), and
what is printed besides (an error naming a path, a value from a manifest someone else wrote)
passes the CLI's consoles, which show each control character as its escape (`\\x1b`):
`\\x1b]52;c;...\\x07` would write the clipboard, `\\x1b[2J` clear the screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.cli import cli

CLIPBOARD = "photo\x1b]52;c;aGk=\x07"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]


@pytest.mark.timeout(60)
def test_an_error_naming_a_hostile_path_reaches_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = tmp_path / f"{CLIPBOARD}\x9b2J"
    for args in (["inspect", str(hostile)], ["show", str(hostile), "-n", "2"]):
        code, out, err = cli(args, capsys)
        assert code == 2 and "Traceback" not in err
        assert _raw_controls(out + err) == [], repr(err)
        assert "photo\\x1b]52;c;aGk=\\x07\\x9b2J" in err, repr(err)


@pytest.mark.timeout(60)
def test_a_picture_with_a_hostile_name_is_still_named_readably(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder of pictures one of which is named with the clipboard sequence: `etl init`
    surveys it and prints what it found with no control character."""
    for folder in ("sky", "sea"):
        (tmp_path / "images" / folder).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (12, 10)).save(tmp_path / "images" / folder / f"{CLIPBOARD}{i}.png")
    code, out, err = cli(["init", str(tmp_path / "images"), "-o", str(tmp_path / "p.yaml")], capsys)
    assert code == 0, err
    assert _raw_controls(out + err) == [], repr(out + err)
