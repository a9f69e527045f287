"""Listings of a prefix stream page by page on every store we claim (NOTE [ a listing in
pages ] in `etl.storage.calls`): moto (S3), fake-gcs-server (GCS) and Azurite (Azure), each
on 127.0.0.1, the fault proxy between for a page that never comes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from etl.errors import SourceError
from etl.sources import in_store
from tests.helpers.emulators import Emulated, emulator
from tests.helpers.stores import faulty_proxy

NEXT_PAGE = {"s3": "?continuation-token", "gs": "?pageToken", "az": "?marker"}
"""What a request for a listing's second page has in its query, per protocol."""


@pytest.fixture(scope="module", params=["s3", "gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Iterator[Emulated]:
    with emulator(request.param) as emulated:
        yield emulated


def through(store: Emulated, proxy: str) -> dict[str, object]:
    """The store's options with its endpoint replaced by `proxy`."""
    options = dict(store.options)
    if store.protocol == "s3":
        options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": proxy}
    elif store.protocol == "gs":
        options["endpoint_url"] = proxy
    else:
        endpoint = str(options["connection_string"]).split("BlobEndpoint=")[1].split("/dev")[0]
        options["connection_string"] = str(options["connection_string"]).replace(endpoint, proxy)
    return options


def upstream(store: Emulated) -> str:
    if store.protocol == "s3":
        return str(store.options["client_kwargs"]["endpoint_url"])
    if store.protocol == "gs":
        return str(store.options["endpoint_url"])
    return str(store.options["connection_string"]).split("BlobEndpoint=")[1].split("/dev")[0]


def test_a_listing_of_three_pages_streams_and_names_a_page_that_never_comes(
    store: Emulated,
) -> None:
    """2,300 objects: every one listed with its size, time and ETag; a second page the store
    never answers is named within the page's time limit, after the first page's keys were
    handed on."""
    store.new_bucket("listed")
    names = [f"photos/c{i % 7}/{i:05d}.png" for i in range(2300)]
    store.fs().pipe({f"listed/{name}": b"x" for name in names})
    url = store.url("listed/photos")
    listed = list(in_store.list_objects(url, store.options, 30.0))
    assert sorted(key for key, *_ in listed) == sorted(n.removeprefix("photos/") for n in names)
    assert all(size == 1 and mtime > 0 and etag for _, size, mtime, etag in listed)
    with faulty_proxy(upstream(store), {NEXT_PAGE[store.protocol]: "stall"}) as proxy:
        got = []
        started = time.monotonic()
        with pytest.raises(SourceError, match="page of the listing took over 2"):
            for key, *_ in in_store.list_objects(url, through(store, proxy), 2.0):
                got.append(key)
        assert len(got) == 1000, "the first page is handed on before the next one is asked"
        assert time.monotonic() - started < 30
