"""Public names the rooms renamed (#72) keep working for a release: each warns once, naming its
new name, at the caller's line, and means what the new name means."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import etl.deprecations
from loaders import DeviceLoader, PackedDataset, make_loader
from tests.helpers.packed import make_packed


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etl.deprecations, "_WARNED", set())


def _former(owner: object, name: str, message: str) -> object:
    """`owner.name` read twice: one DeprecationWarning matching `message` from this file, then
    none."""
    with pytest.warns(DeprecationWarning, match=message) as caught:
        value = getattr(owner, name)
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(owner, name) == value
    return value


def test_shard_set_ragged_is_flat(tmp_path: Path) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(3, 2), sample_shape=(4, 5, 3))
    shards = PackedDataset.open(packed.root).selection.shards
    value = _former(shards, "ragged", r"ShardSet\.ragged is deprecated: use ShardSet\.flat")
    assert value is shards.flat is False  # rows of one shape: not the flat layout
    encoded = make_packed(tmp_path / "zlib", shard_sizes=(3,), sample_shape=(4, 5, 3), codec="zlib")
    flat = PackedDataset.open(encoded.root).selection.shards
    assert flat.ragged is flat.flat is True  # one array of stored bytes a shard


def test_device_loader_stream_is_copy_stream(tmp_path: Path) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(3,), sample_shape=(4, 5, 3))
    device = DeviceLoader(
        make_loader(PackedDataset.open(packed.root), batch_size=2, pin_memory=False), device="cpu"
    )
    message = r"DeviceLoader\.stream is deprecated: use DeviceLoader\.copy_stream"
    assert _former(device, "stream", message) is device.copy_stream is None  # no CUDA here


def test_the_front_door_holds_what_a_training_script_needs() -> None:
    """`loaders.__all__` is the short list; each of its names imports without a warning."""
    import loaders

    assert len(loaders.__all__) == 16 and not set(loaders.__all__) & set(loaders.FORMER_NAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(getattr(loaders, name) is not None for name in loaders.__all__)


@pytest.mark.parametrize("name", sorted(__import__("loaders").FORMER_NAMES))
def test_a_name_that_left_the_front_door_still_imports_and_warns_once(name: str) -> None:
    import importlib

    import loaders

    module = loaders.FORMER_NAMES[name]
    message = rf"loaders\.{name} is deprecated: use {module}\.{name}"
    assert _former(loaders, name, message) is getattr(importlib.import_module(module), name)


def test_the_former_augment_module_still_imports_and_warns_once() -> None:
    """`from loaders.augment import ...`, as the docs once wrote it, for every name it held."""
    import loaders
    import loaders.augment
    import loaders.augment.crops
    import loaders.augment.draws

    assert _former(loaders.augment, "RandomResizedCrop", r"use loaders\.RandomResizedCrop") is (
        loaders.RandomResizedCrop
    )
    assert _former(loaders.augment, "crop_boxes", r"use loaders\.augment\.draws\.crop_boxes") is (
        loaders.augment.draws.crop_boxes
    )
    assert _former(loaders.augment, "Augment", r"use loaders\.augment\.crops\.Augment") is (
        loaders.augment.crops.Augment
    )
    with pytest.raises(ImportError, match="no_such_crop"):
        exec("from loaders.augment import no_such_crop")
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = loaders.no_such_name
