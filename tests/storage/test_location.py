"""Where a dataset is (`etl.storage.location`): the one decision between a local folder and a
store, made from the text a user gives, and the options only a store takes. No server here:
a URL is opened only as far as its driver, which fetches nothing until asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.errors import ManifestError, SourceError
from etl.storage.location import StoreOptions, StoreUrl, as_location, is_url, open_location
from etl.storage.transport import filesystem
from tests.helpers.packed import make_packed


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("s3://bucket/ds", True),
        ("gs://b/x/", True),
        ("az://container/ds", True),
        ("memory://x", True),
        ("file:///tmp/ds", False),
        ("/tmp/ds", False),
        ("relative/ds", False),
        ("C:\\data\\ds", False),
        ("a folder named s3:", False),
        ("", False),
    ],
)
def test_a_url_is_any_scheme_but_file(text: str, url: bool) -> None:
    assert is_url(text) is url
    assert is_url(Path(text) if text and not url else text) is url


def test_text_becomes_a_store_url_or_a_path_once() -> None:
    """`as_location` is the one parse: a URL is a `StoreUrl` (a str, no trailing '/'), the rest
    a `Path` (a file:// prefix dropped), and a parsed value comes back as it is."""
    url = as_location("s3://b/ds/")
    assert type(url) is StoreUrl and url == "s3://b/ds" and f"{url}/x" == "s3://b/ds/x"
    assert as_location(url) is url and as_location(Path("s3:/x")) == Path("s3:/x")
    assert as_location("file:///tmp/ds") == Path("/tmp/ds") and as_location("x/") == Path("x")
    assert url.contains(as_location("s3://b/ds/part")) and url.contains(url)
    assert not url.contains(as_location("s3://b/dsx")) and not url.contains(Path("s3://b/ds"))


def test_a_config_location_is_parsed_into_its_type(tmp_path: Path) -> None:
    """output.dir and source.path as the config gives them: a URL a `StoreUrl`, a path a
    `Path`; store options beside a local path are refused by type, not by text."""
    from etl.config.pipeline import OutputConfig
    from etl.config.sources import FolderSource

    assert type(OutputConfig(dir="s3://b/ds/").dir) is StoreUrl
    assert OutputConfig(dir="file://" + str(tmp_path)).dir == tmp_path
    in_store = FolderSource(path="gs://b/photos", storage_options={"token": "anon"})
    assert type(in_store.path) is StoreUrl
    with pytest.raises(ValueError, match=r"storage_options are for a source\.path in object"):
        FolderSource(path=str(tmp_path), storage_options={"token": "anon"})


def test_a_local_path_opens_as_itself_and_a_relative_one_from_its_folder(tmp_path: Path) -> None:
    packed = make_packed(tmp_path / "ds")
    here = open_location(packed.root)
    assert here.store is None and here.url is None and here.root == packed.root
    assert here.versions() == [1] and here.fetch_version(None) is None
    views = tmp_path / "views"
    views.mkdir()
    relative = open_location("../ds", relative_to=views)
    assert relative.root == views / ".." / "ds" and relative.versions() == [1]
    absolute = open_location(str(packed.root), relative_to=views)  # an absolute path stays
    assert absolute.root == packed.root
    assert open_location(f"file://{packed.root}").root == packed.root
    assert as_location("s3://b/ds/") == "s3://b/ds" and as_location("x/") == Path("x")
    with pytest.raises(ManifestError, match="empty: no such dataset directory"):
        open_location(tmp_path / "empty").versions()


def test_store_options_are_refused_for_a_local_folder_and_checked_up_front(
    tmp_path: Path,
) -> None:
    for options, name in (
        (StoreOptions(ranged=True), "ranged"),
        (StoreOptions(cache_limit=1), "cache_limit"),
    ):
        with pytest.raises(ValueError, match=f"{name} is for a dataset in object storage"):
            open_location(tmp_path, options)
    with pytest.raises(ValueError, match="ranged=True caches no shard"):
        StoreOptions(ranged=True, cache_limit="1GiB")
    assert StoreOptions(cache_limit="2KiB").cache_limit == 2048
    with pytest.raises(ValueError):
        StoreOptions(cache_limit="lots")


def test_a_url_opens_its_mirror_in_the_cache_without_a_request(tmp_path: Path) -> None:
    """A URL's location is the mirror folder under the cache, one per URL; fsspec's memory
    store stands in for a bucket (nothing is listed or fetched at open), allowed as a user
    allows a protocol that is not a store's."""
    pytest.importorskip("fsspec")
    options = StoreOptions(cache_dir=tmp_path, allow_protocols=("memory",))
    first = open_location("memory://bucket/ds", options)
    again = open_location("memory://bucket/ds/", options)
    other = open_location("memory://bucket/other", options)
    assert first.store is not None and first.url == "memory://bucket/ds"
    assert first.root == again.root and first.root.parent == tmp_path
    assert other.root != first.root and not any(tmp_path.iterdir())


def test_a_missing_driver_is_one_line_naming_the_install(tmp_path: Path) -> None:
    """A store whose driver is not installed: one error naming the URL and what to install,
    for a dataset and for a source alike (never an ImportError's traceback); a scheme no
    driver has (a typo) is one error naming it."""
    code = (
        "import sys\nsys.modules['gcsfs'] = None\n"
        "from etl.errors import EtlError\n"
        "from etl.storage.location import open_location\n"
        "try:\n    open_location('gs://bucket/ds')\n"
        "except EtlError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "ETL_CACHE": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    assert said.startswith("ManifestError gs://bucket/ds: reading from object storage needs ")
    assert "gcsfs" in said and said.endswith(": pip install 'etl-memmap[s3]' (or gcsfs, adlfs)")
    assert len(said.splitlines()) == 1
    pytest.importorskip("fsspec")
    with pytest.raises(SourceError, match=r"^s4://x: not a store fsspec knows \(.*s4"):
        filesystem("s4://x", None, SourceError)
