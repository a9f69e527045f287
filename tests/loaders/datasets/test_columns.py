"""Datasets and batches that carry per-sample columns (`columns=["caption", ...]`): every batch
of the map-style loader (0 and 2 workers), the stream and the DeviceLoader holds each sample's
values as the listing wrote them; a column whose values have one shape is a tensor, any other a
list; `where=` filters on them in SQL or with Arrow. The oracle is the test's own values by
source, matched through the manifest read with plain pyarrow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from etl.config import load_config
from etl.errors import SelectionError
from etl.run import pipeline
from loaders import DeviceLoader, PackedDataset, PackedStream, make_loader
from loaders.batch.types import ColumnBatch
from loaders.loader.factories import stream_loader
from loaders.read.catalog import open_catalog
from tests.helpers.columns import write_captioned, write_listing_config
from tests.helpers.encoded import reference

NAMES = ["caption", "score", "embedding", "boxes", "meta"]


@pytest.fixture(scope="module")
def captioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    tmp_path = tmp_path_factory.mktemp("captioned")
    expected = write_captioned(tmp_path / "photos", count=23)
    config = load_config(write_listing_config(tmp_path))
    report = pipeline.run(config)
    assert report.packed_new == 23
    return tmp_path / "out", expected


def sources_of(out: Path, indices: torch.Tensor, ds: PackedDataset) -> list[str]:
    """The source of each dataset index, through the manifest as plain pyarrow reads it."""
    version = sorted((out / "versions").iterdir())[-1]
    with pa.ipc.open_file(version / "manifest.arrow") as reader:
        table = reader.read_all()
    positions = ds.selection.positions[indices.numpy()]
    return table.column("source").take(pa.array(positions)).to_pylist()


def check_batch(batch: Any, out: Path, ds: PackedDataset, expected: dict[str, Any]) -> list[str]:
    assert isinstance(batch, ColumnBatch)
    sources = sources_of(out, batch.indices, ds)
    assert isinstance(batch.columns["score"], torch.Tensor)
    assert batch.columns["score"].dtype == torch.float32
    assert isinstance(batch.columns["embedding"], torch.Tensor)
    assert tuple(batch.columns["embedding"].shape) == (len(sources), 3)
    assert isinstance(batch.columns["caption"], list)  # text
    assert isinstance(batch.columns["boxes"], list)  # lists of 0 to 2 boxes
    for i, source in enumerate(sources):
        want = expected[source]
        assert batch.columns["caption"][i] == want["caption"]
        assert float(batch.columns["score"][i]) == want["score"]
        assert batch.columns["embedding"][i].tolist() == want["embedding"]
        assert batch.columns["boxes"][i] == want["boxes"]
        assert batch.columns["meta"][i] == want["meta"]
        assert ds.classes[int(batch.labels[i])] == want["label"]
    return sources


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_carries_its_samples_values(
    captioned: tuple[Path, dict[str, dict[str, Any]]], workers: int
) -> None:
    out, expected = captioned
    ds = PackedDataset.open(out, columns=NAMES)
    loader = make_loader(
        ds, batch_size=5, shuffle=True, seed=3, num_workers=workers, workers_as="processes"
    )
    seen: list[str] = []
    for batch in loader:
        sources = check_batch(batch, out, ds, expected)
        for i, source in enumerate(sources):
            image = reference((out.parent / "photos" / source).read_bytes())
            assert np.array_equal(batch.images[i].numpy(), image)
        seen += sources
    assert sorted(seen) == sorted(expected)
    loader = make_loader(ds, batch_size=7, num_workers=workers, workers_as="processes")
    for batch in DeviceLoader(loader, device="cpu", dtype=torch.float32):
        check_batch(batch, out, ds, expected)
        assert batch.images.dtype == torch.float32


def test_a_stream_carries_them_too(captioned: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    out, expected = captioned
    ds = PackedDataset.open(out, columns=NAMES)
    stream = PackedStream(ds.selection, batch_size=4, seed=1, window=2)
    seen: list[str] = []
    for batch in stream_loader(stream, num_workers=2):
        seen += check_batch(batch, out, ds, expected)
    assert set(seen) == set(expected)  # each of 2 workers' slots padded to an equal share


def test_single_samples_and_plain_dataloader(
    captioned: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    out, expected = captioned
    ds = PackedDataset.open(out, columns=["caption", "score"])
    image, label, index, values = ds[4]
    (source,) = sources_of(out, torch.tensor([index]), ds)
    assert np.array_equal(image.numpy(), reference((out.parent / "photos" / source).read_bytes()))
    assert ds.classes[label] == expected[source]["label"]
    assert values["caption"] == expected[source]["caption"]
    assert float(values["score"]) == expected[source]["score"]
    loader = torch.utils.data.DataLoader(ds, batch_size=3)  # default collate, no helper of ours
    images, labels, indices, columns = next(iter(loader))
    sources = sources_of(out, indices, ds)
    assert images.shape[0] == 3 and [ds.classes[i] for i in labels] == [
        expected[s]["label"] for s in sources
    ]
    assert columns["caption"] == [expected[s]["caption"] for s in sources]
    assert columns["score"].tolist() == [expected[s]["score"] for s in sources]


def test_where_filters_on_columns_in_sql_and_arrow(
    captioned: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    out, expected = captioned
    catalog = open_catalog(out)
    wanted = {s for s, v in expected.items() if v["score"] > 2.0 and len(v["boxes"]) == 1}
    for where in (
        "score > 2.0 AND len(boxes) = 1",
        (pc.field("score") > 2.0) & (pc.list_value_length(pc.field("boxes")) == 1),
    ):
        selection = catalog.select(where=where)
        sources = catalog.table.column("source").take(pa.array(selection.positions))
        assert set(sources.to_pylist()) == wanted
    struct_field = catalog.select(where="meta.origin = 'cam1'")
    assert len(struct_field) == sum(v["meta"]["origin"] == "cam1" for v in expected.values())
    with pytest.raises(SelectionError, match="is not a condition"):
        catalog.select(where="1 = 1); DROP TABLE samples; --")
    with pytest.raises(SelectionError, match="nope"):
        catalog.select(where="nope > 1")
    secret = out.parent / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(SelectionError, match="subquery is not allowed in a predicate"):
        catalog.select(where=f"(SELECT count(*) FROM read_csv('{secret}')) > 0")


def test_unknown_columns_and_datasets_without_them(
    captioned: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = captioned
    with pytest.raises(SelectionError, match=r"no per-sample column \['nope'\]"):
        PackedDataset.open(out, columns=["caption", "nope"])
    with pytest.raises(TypeError, match="a list of names"):
        PackedDataset.open(out, columns="caption")  # type: ignore[arg-type]
    plain = PackedDataset.open(out)
    images, labels = next(iter(make_loader(plain, batch_size=4)))  # unchanged without columns
    assert len(images) == len(labels) == 4
    rows = plain.manifest_rows([0])
    assert set(NAMES) <= set(rows.column_names)
