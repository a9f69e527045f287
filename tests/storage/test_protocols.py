"""No request nobody asked for (NOTE [ no request nobody asked for ] in etl.storage.transport):
a URL of a protocol that is not a store's (http://, memory://, ...) is refused in one line
naming it and how to allow it, whoever wrote the URL (a user, a loader state's run record, a
listing), and is reached once the user allows it: `StoreOptions(allow_protocols=...)`,
`source.allow_protocols` in pipeline.yaml, or `etl --allow-protocol P`. A loopback HTTP server
counts the requests: none before the user's word."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from etl.errors import EtlError
from etl.storage.location import StoreOptions
from etl.storage.transport import ALLOW_ENV
from loaders import PackedDataset, make_loader
from tests.helpers.cli import cli
from tests.helpers.packed import make_packed

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


@pytest.fixture
def listening() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that answers 404 to everything: its URL and the paths
    asked of it."""
    asked: list[str] = []

    class Counting(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_error(404)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _no_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)  # restored after a test that sets it


@pytest.mark.timeout(60)
def test_a_dataset_url_of_another_protocol_is_refused_until_allowed(
    tmp_path: Path, listening: tuple[str, list[str]]
) -> None:
    url, asked = listening
    with pytest.raises(EtlError) as raised:
        PackedDataset.open(f"{url}/latest/meta-data", store=StoreOptions(cache_dir=tmp_path))
    message = str(raised.value)
    assert "http://" in message and "allow_protocols" in message and "\n" not in message
    assert asked == []
    allowed = StoreOptions(cache_dir=tmp_path, allow_protocols=("http",))
    with pytest.raises(EtlError):  # allowed: asked, and the 404 is the store's answer
        PackedDataset.open(f"{url}/latest/meta-data", store=allowed)
    assert asked


@pytest.mark.timeout(120)
def test_etl_trace_of_a_state_naming_an_internal_host_sends_nothing(
    tmp_path: Path,
    listening: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loader state whose run record names `http://127.0.0.1:PORT/...` as its dataset (what
    a hostile state file can say): `etl trace --step 1` is one line and exit code 2 asking for
    --allow-store, with it one line more naming the protocol; the host is sent nothing until
    `etl --allow-protocol http trace ... --allow-store`."""
    url, asked = listening
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 5), sample_shape=(8, 8, 3))
    loader = make_loader(
        PackedDataset.open(packed.root), batch_size=4, shuffle=True, pin_memory=False
    )
    for _ in loader:
        pass
    state = loader.state_dict()
    record = json.loads(state["run"])
    record["dataset"] = f"{url}/latest/meta-data/iam"
    state["run"] = json.dumps(record)
    hostile = tmp_path / "state.json"
    hostile.write_text(json.dumps(state))
    code, _, err = cli(["trace", str(hostile), "--step", "1"], capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "http://127.0.0.1" in err and "--allow-store" in err
    code, _, err = cli(["trace", str(hostile), "--step", "1", "--allow-store"], capsys)
    said = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and said[0].startswith("opening http://"), err
    assert len(said) == 2 and "--allow-protocol" in said[1], err
    assert asked == []
    asking = ["--allow-protocol", "http", "trace", str(hostile), "--step", "1", "--allow-store"]
    code, _, err = cli(asking, capsys)
    assert code == 2 and "Traceback" not in err
    assert asked, "allowed: the host was asked"


@pytest.mark.timeout(120)
def test_a_source_path_of_another_protocol_is_refused_until_allowed(
    tmp_path: Path, listening: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`source.path: http://127.0.0.1:PORT/images`: `etl run` ends in one line naming the
    protocol and exit code 2, the host asked nothing; with `source.allow_protocols: [http]`
    it is asked (and the run fails on its 404s, still in one line)."""
    url, asked = listening
    for allow, out in (("", "out1"), (", allow_protocols: [http]", "out2")):
        config = tmp_path / f"{out}.yaml"
        config.write_text(
            f"source: {{kind: folder, path: '{url}/images'{allow}}}\n"
            "stages:\n  - decode: {}\n  - resize: {size: [8, 8]}\n"
            f"output: {{dir: {tmp_path / out}}}\nrun: {{n_jobs: 1, backend: sequential}}\n"
        )
        code, _, err = cli(["run", str(config)], capsys)
        assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        if not allow:
            assert "http://" in err and "allow_protocols" in err, err
            assert asked == [], asked
    assert asked
