"""Object stores for tests, on 127.0.0.1 only: moto's S3 server (a real S3-compatible
endpoint), and an endpoint that accepts connections and never answers (a hung store)."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1, emptied and stopped on the way out."""
    from moto.server import ThreadedMotoServer

    # NOTE: werkzeug logs each request at INFO to the stderr of the test that made its first
    # one, which then reads as a command's output: its requests are not what a test reads
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        # moto keeps its buckets in this process, whichever server serves them: forget them,
        # so the next server starts empty
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
        ).close()
        server.stop()


def client_options(endpoint: str) -> dict[str, Any]:
    """Credentials and endpoint as a user passes them in storage_options: nothing is read
    from the environment, and no request leaves 127.0.0.1."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def uploaded(root: Path, endpoint: str, bucket: str) -> str:
    """The dataset folder `root` copied into a new bucket `bucket`, as `ds`: its URL."""
    import s3fs

    new_bucket(endpoint, bucket)
    s3fs.S3FileSystem(**client_options(endpoint)).put(str(root), f"{bucket}/ds", recursive=True)
    return f"s3://{bucket}/ds"


def point_at(endpoint: str, monkeypatch: pytest.MonkeyPatch, cache: Path | None = None) -> None:
    """The environment a user sets for a store at `endpoint` (and a cache folder), with
    s3fs's cached instances dropped: they keep the endpoint they were made with."""
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if cache is not None:
        settings["ETL_CACHE"] = str(cache)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def new_bucket(endpoint: str, name: str) -> None:
    """Create bucket `name` at `endpoint` with the test credentials, nothing from the
    environment."""
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=name)


def packed_contents(root: Path) -> tuple[dict[str, tuple[Any, ...]], dict[str, str]]:
    """A local dataset's latest version, read with pyarrow and numpy alone: samples (class,
    split, pixels) and rejects (reason) by source."""
    import pyarrow as pa

    versions = sorted(p for p in (root / "versions").iterdir() if p.name.startswith("v"))

    def table(name: str) -> pa.Table:
        with pa.ipc.open_file(versions[-1] / name) as reader:
            return reader.read_all()

    samples = {
        s["source"]: (
            s["class_name"],
            s["split"],
            np.load(root / s["shard"], mmap_mode="r")[s["row"]].tobytes(),
        )
        for s in table("manifest.arrow").to_pylist()
    }
    return samples, {r["source"]: r["reason"] for r in table("rejects.arrow").to_pylist()}


def stored_in_bucket(fs: Any, prefix: str = "published/out") -> tuple[dict[str, Any], dict]:
    """The latest version in the bucket, read with s3fs, pyarrow and numpy alone: samples
    (class, split, pixels) and rejects (reason) by source."""
    import io
    import json
    import re

    import pyarrow as pa

    fs.invalidate_cache()
    versions = sorted(
        p.rsplit("/", 1)[1] for p in fs.ls(f"{prefix}/versions") if re.search(r"/v\d{6}$", p)
    )
    folder = f"{prefix}/versions/{versions[-1]}"
    record = json.loads(fs.cat(f"{folder}/commit.json"))
    files = f"{prefix}/versions/{record['files_at']}"

    def table(name: str) -> pa.Table:
        return pa.ipc.open_file(pa.BufferReader(fs.cat(f"{files}/{name}"))).read_all()

    shards: dict[str, np.ndarray] = {}
    samples = {}
    for s in table("manifest.arrow").to_pylist():
        if s["shard"] not in shards:
            shards[s["shard"]] = np.load(io.BytesIO(fs.cat(f"{prefix}/{s['shard']}")))
        pixels = shards[s["shard"]][s["row"]].tobytes()
        samples[s["source"]] = (s["class_name"], s["split"], pixels)
    rejects = {r["source"]: r["reason"] for r in table("rejects.arrow").to_pylist()}
    return samples, rejects


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


S3_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error>"
)


@contextlib.contextmanager
def faulty_proxy(
    upstream: str,
    faults: dict[str, str],
    held: threading.Event | None = None,
    delay: float = 0.0,
    seen: list[str] | None = None,
) -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 that forwards every request to `upstream` (moto's server),
    except requests for a key ending in one of `faults` (path suffix -> fault):

    - "throttle": every request answered 503 SlowDown, a throttle that never clears;
    - "throttle-2": the first two requests answered 503 SlowDown, a throttle that clears;
    - "deny": 403 AccessDenied;
    - "short": a GET's body cut in half, its Content-Length still the whole length, and the
      connection closed (a body shorter than its length);
    - "shortened": a GET's body cut in half with a Content-Length that says so and no checksum
      header, while HEAD still gives the whole size (a store that serves less than it lists);
    - "hold": a PUT is never answered (until the proxy stops); `held` is set when one arrives,
      so a test can kill the writer mid-upload;
    - "late": every PUT held `delay` seconds (past the client's timeout), then forwarded, as a
      store that answers late but acts on it;
    - "reset": a GET's connection reset (RST) after half its body;
    - "oversend": a GET answered with its body ten times over, the Content-Length saying so
      (a store that sends more than the manifest records);
    - "swap:<suffix>": a GET answered with the object whose key ends in <suffix> instead;
    - "stall": any request never answered (until the proxy stops): a store that stops
      answering mid-listing;
    - any fault + "-once" ("reset-once", "late-once"): the first such request only, per method
      and path (a fault that clears).

    A key "?text" matches requests whose query holds `text` instead (a listing's later pages:
    "?continuation-token"). `seen` gets "METHOD /bucket/key" of every request without a
    query (what was read or written, not listed).
    """
    release = threading.Event()
    answered: dict[str, int] = {}
    """Requests seen per path, for "throttle-2"."""
    counted = threading.Lock()
    import http.client
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    target = urlsplit(upstream)

    def keys(path: str) -> list[str]:
        """The bucket's keys as paths on the upstream, for "swap"."""
        bucket = urlsplit(path).path.lstrip("/").split("/", 1)[0]
        conn = http.client.HTTPConnection(str(target.hostname), target.port, timeout=30)
        conn.request("GET", f"/{bucket}?list-type=2")
        listing = conn.getresponse().read().decode()
        conn.close()
        return [f"/{bucket}/{key}" for key in re.findall(r"<Key>([^<]+)</Key>", listing)]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _error(self, status: int, code: str) -> None:
            body = S3_ERROR.format(code=code, message=code).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            path, query = urlsplit(self.path).path, urlsplit(self.path).query
            fault = next(
                (
                    f
                    for key, f in faults.items()
                    if (key[1:] in query if key.startswith("?") else path.endswith(key))
                ),
                None,
            )
            if seen is not None and not query:
                with counted:
                    seen.append(f"{self.command} {path}")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if fault and fault.endswith("-once"):
                with counted:
                    answered[f"{self.command} {path}"] = (
                        answered.get(f"{self.command} {path}", 0) + 1
                    )
                    first = answered[f"{self.command} {path}"] == 1
                fault = fault.removesuffix("-once") if first else None
            if fault == "throttle":
                return self._error(503, "SlowDown")
            if fault == "throttle-2":
                with counted:
                    answered[path] = answered.get(path, 0) + 1
                    if answered[path] <= 2:
                        return self._error(503, "SlowDown")
            if fault == "deny":
                return self._error(403, "AccessDenied")
            if fault == "stall":
                release.wait(120)
                return self._error(503, "SlowDown")
            if fault == "hold" and self.command == "PUT":
                if held is not None:
                    held.set()
                release.wait(120)
                return self._error(503, "SlowDown")
            if fault == "late" and self.command == "PUT":
                if held is not None:
                    held.set()
                release.wait(delay)
            asked = self.path
            if fault and fault.startswith("swap:") and self.command == "GET":
                other = fault.split(":", 1)[1]
                asked = next(k for k in keys(self.path) if k.endswith(other))
            upstream_conn = http.client.HTTPConnection(
                str(target.hostname), target.port, timeout=30
            )
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            upstream_conn.request(self.command, asked, body, headers)
            answer = upstream_conn.getresponse()
            data = answer.read()
            upstream_conn.close()
            self.send_response(answer.status)
            dropped = {"transfer-encoding", "connection", "content-length"}
            for key, value in answer.getheaders():
                # "shortened": no checksum header either, as from a store that sends none
                checksum = fault == "shortened" and key.lower().startswith("x-amz-checksum")
                if key.lower() not in dropped and not checksum:
                    self.send_header(key, value)
            whole = answer.getheader("Content-Length") if self.command == "HEAD" else None
            if fault == "shortened" and self.command == "GET":
                data = data[: len(data) // 2]
            if fault == "oversend" and self.command == "GET" and answer.status < 300:
                data = data * 10
            self.send_header("Content-Length", whole or str(len(data)))
            if fault == "short" and self.command == "GET" and data:
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return None
            if fault == "reset" and self.command == "GET" and data:
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()  # with linger 0: a reset, not a clean close
                self.close_connection = True
                return None
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return None

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def named_by_versions(fs: Any, prefix: str = "published/out") -> set[str]:
    """Every object some published version names: its record, its files, its shards."""
    import json

    import pyarrow as pa

    named = set()
    for folder in fs.ls(f"{prefix}/versions"):
        if not re.search(r"/v\d{6}$", folder):
            continue
        record = json.loads(fs.cat(f"{folder}/commit.json"))
        named.add(f"{folder}/commit.json")
        files = f"{prefix}/versions/{record['files_at']}"
        named.update(f"{files}/{name}" for name in record["files"])
        shards = pa.ipc.open_file(pa.BufferReader(fs.cat(f"{files}/shards.arrow"))).read_all()
        named.update(f"{prefix}/{name}" for name in shards.column("shard").to_pylist())
    return named


def all_objects(fs: Any, prefix: str = "published/out") -> set[str]:
    """Every object under `prefix`."""
    fs.invalidate_cache()
    return set(fs.find(prefix))
