"""No credential a URL carries (`user:pass@`, a SAS token, a presigned signature) appears in a
message: every EtlError is redacted as it is made, whoever makes it; tried end to end against
moto's S3 server on 127.0.0.1 with the keys in the URL, as s3fs takes them."""

from __future__ import annotations

import pickle

import pytest

from etl.errors import ManifestError, redacted, without_credentials
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


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"etl run p.yaml --address tls://dask:{SECRET}@127.0.0.1:8786", "--address tls://"),
        (f"etl x --secret {SECRET} --token={SECRET} --rebuild", "--rebuild"),
        ("etl x --key-id AKIAABCDEFGHIJKLMNOP", "--key-id"),
    ],
)
def test_a_command_line_keeps_no_secret_it_was_given(text: str, kept: str) -> None:
    assert SECRET not in redacted(text) and "AKIAABCDEFGHIJKLMNOP" not in redacted(text)
    assert kept in redacted(text)


def test_a_url_recorded_to_open_again_keeps_no_credential_and_still_opens() -> None:
    """A run's record keeps a URL without its user info and secret parameters (not masked:
    it is opened again with the environment's credentials)."""
    assert without_credentials(f"s3://AKIA:{SECRET}@bucket/ds") == "s3://bucket/ds"
    assert without_credentials(f"az://c/ds?sv=2024&sig={SECRET}&tier=hot") == "az://c/ds?tier=hot"
    assert without_credentials("gs://b/photos/ds") == "gs://b/photos/ds"


def test_a_version_records_its_command_line_without_secrets(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`etl.command` in a packed version's metadata, read with pyarrow alone, after a run
    whose command line carried a password in a URL and a --secret option."""
    import pyarrow.ipc as ipc

    import etl.format.commit as commit
    from etl.config import load_config
    from etl.run import pipeline
    from tests.helpers.codecs import write_config, write_photos

    write_photos(tmp_path / "images", count=4)
    config = write_config(tmp_path, "raw")
    typed = ["etl", "run", str(config), "--address", f"tls://u:{SECRET}@h:1", "--secret", SECRET]
    monkeypatch.setattr(commit, "INVOKED_AS", typed)
    assert pipeline.run(load_config(config)).committed
    (manifest,) = (tmp_path / "out").glob("versions/*/manifest.arrow")
    meta = ipc.open_file(str(manifest)).schema.metadata
    command = meta[b"etl.command"].decode()
    assert SECRET not in command and "run" in command and "--address tls://" in command
