"""Options every test module may read.

`--fuzz-long` draws thousands of mutations per stored file kind (tests/format/test_format_fuzz.py)
instead of the few dozen a CI run draws.

`--break-mechanism NAME` proves that a CUDA test can fail: it removes one mechanism of the
GPU path (see `BREAKS` in tests/loaders/device/test_cuda.py), keeps only the tests marked as
guarding it (`@pytest.mark.guards(NAME)`), and those must then fail. benchmarks/gpu_check.sh runs
each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# gcsfs (2026.x) asks a GCS bucket's type over gRPC before its first call, and against an
# emulator waits 60 s for that to fail; its plain client needs no such probe. Read when gcsfs
# is imported, by this process and every `etl` the tests start.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help="thousands of drawn mutations per file kind in tests/format/test_format_fuzz.py",
    )
    parser.addoption(
        "--break-mechanism",
        default=None,
        help="remove one CUDA mechanism and run only the tests that guard it (they must fail)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guards(name): the mechanism a test fails without")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    broken = config.getoption("--break-mechanism")
    if broken is None:
        return
    keep = [item for item in items if broken in _guarded(item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def _guarded(item: pytest.Item) -> set[str]:
    return {name for mark in item.iter_markers("guards") for name in mark.args}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1, one per test module that asks for it."""
    pytest.importorskip("moto.server")
    from tests.helpers.stores import moto_endpoint

    with moto_endpoint() as url:
        yield url
