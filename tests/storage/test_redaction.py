"""No credential a URL carries (`user:pass@`, a SAS token, a presigned signature) appears in a
message: every EtlError is redacted as it is made, whoever makes it; tried end to end against
moto's S3 server on 127.0.0.1 with the keys in the URL, as s3fs takes them."""

from __future__ import annotations

import pickle

import pytest

from etl.errors import ManifestError, redacted
from tests.helpers.cli import cli
from tests.helpers.stores import new_bucket, point_at

SECRET = "Top5ecretValue"


@pytest.mark.parametrize(
    "text",
    [
        f"s3://AKIAXYZ:{SECRET}@bucket/ds: not found",
        f"https://acct.blob.core.windows.net/c/ds?sv=2024&sp=r&sig={SECRET}%3D: 403",
        f"gs://b/ds (https://x/y?X-Goog-Signature={SECRET}&X-Goog-Credential={SECRET})",
        f"az://c/ds?token={SECRET} and http://u:{SECRET}@127.0.0.1:9/x",
    ],
)
def test_a_message_never_repeats_a_credential(text: str) -> None:
    assert SECRET not in redacted(text)
    error = ManifestError(text)
    assert SECRET not in str(error)
    assert SECRET not in str(pickle.loads(pickle.dumps(error))), "nor in a worker's copy"
    assert "***" in str(error)


def test_a_plain_message_is_left_as_it_is() -> None:
    text = "s3://bucket/datasets/ds/versions/v000001/commit.json: not in the store (a=1&b=2)"
    assert redacted(text) == text


def test_keys_in_a_url_are_never_printed(
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("s3fs")
    point_at(endpoint, monkeypatch)
    new_bucket(endpoint, "creds")
    url = f"s3://testing:{SECRET}@creds/missing"
    for command in (["inspect", url], ["versions", url, "--json"], ["audit", url, "--json"]):
        code, out, err = cli(command, capsys)
        assert code == 2, out + err
        assert SECRET not in out + err, command
        assert "creds/missing" in err


def test_an_error_that_embeds_a_traceback_is_described_in_one_line() -> None:
    """fsspec's background prefetcher raises an AssertionError whose message is a whole
    traceback: a message naming it keeps its first line and the error below, in one line."""
    from etl.errors import described

    embedded = AssertionError(
        "Consumer caught an error.\n  Traceback (most recent call last):\n"
        '    File "gcsfs/core.py", line 1340, in _cat_file_sequential\n'
        "  FileNotFoundError: http://127.0.0.1:1/download/b/o/out%2Fshards%2Fa.npy\n"
        "  Exception raised during asynchronous fetch.\n"
    )
    line = described(embedded)
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("AssertionError: Consumer caught an error.")
    assert line.endswith(
        "[FileNotFoundError: http://127.0.0.1:1/download/b/o/out%2Fshards%2Fa.npy]"
    )
    assert described(OSError(5, "I/O error")) == "OSError: [Errno 5] I/O error"
