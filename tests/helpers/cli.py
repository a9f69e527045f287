"""The `etl` command as a user meets it, in this process: exit code, stdout and stderr."""

from __future__ import annotations

import pytest

from etl.cli import main


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    captured = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 0), captured.out, captured.err
