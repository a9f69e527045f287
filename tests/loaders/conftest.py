"""What the loader tests share: one packed dataset of five uneven shards, made once a module and
never changed (a test that damages a dataset makes its own with `make_packed`)."""

from __future__ import annotations

import pytest

from tests.helpers.packed import Packed, make_packed


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(tmp_path_factory.mktemp("ds"), shard_sizes=(13, 8, 21, 5, 17))


@pytest.fixture(autouse=True)
def _broken(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--break-mechanism NAME`, remove that mechanism as the test module's `BREAKS`
    says (the CUDA tests: tests/loaders/device/test_cuda.py, test_cuda_ring.py)."""
    name = request.config.getoption("--break-mechanism")
    breaks = getattr(request.module, "BREAKS", None)
    if name is not None and breaks is not None and name in breaks:
        breaks[name](monkeypatch)
