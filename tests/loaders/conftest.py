"""What the loader tests share: one packed dataset of five uneven shards, made once a module and
never changed (a test that damages a dataset makes its own with `make_packed`)."""

from __future__ import annotations

import pytest

from tests.helpers.packed import Packed, make_packed


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(tmp_path_factory.mktemp("ds"), shard_sizes=(13, 8, 21, 5, 17))
