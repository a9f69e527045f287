"""Look at a packed dataset: the manifest as a table, samples as images, summaries and pictures.

    import etl.explore.dataset as ex
    ds = ex.open_dataset("artifacts")          # the latest version; version=N pins one
    ds.table                                   # the manifest, an Arrow table
    ds.to_pandas()                             # the same as a pandas DataFrame
    ds.image("3f2a9c0d1e4b5a67")               # a sample as a PIL image, by sample_id or position
    ds.counts()                                # {split: {class: samples}}
    ds.contact_sheet(n=16, classes=["circle"]) # a Sheet; shows itself in a notebook
    ds.class_balance()                         # a Chart of samples per class and split

Everything here returns data, PIL images or small dataclasses that hold them; nothing prints or
writes files (the CLI, `etl inspect` and `etl show`, saves them). Pictures are drawn with Pillow
alone: no plotting library is needed. Shards are opened through
`etl.format.shards.open_shard`, which
checks each file against the manifest, and are read through read-only memmaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from PIL import Image

from etl.errors import EtlError, ShardError
from etl.explore.drawing import Cell, Chart, Sheet, draw_class_balance, draw_sheet
from etl.explore.reject_sheet import reject_cells
from etl.explore.summary import Summary, summarize
from etl.format.contents import VersionContents, Where
from etl.format.flat import encoding_of, place_of, stored_sample
from etl.format.manifest import Manifest, list_versions, read_manifest
from etl.format.shards import open_shard
from etl.storage.location import StoreOptions, open_location
from etl.storage.store import StoreDataset

if TYPE_CHECKING:
    # NOTE: pydantic costs 0.25 s to import; only rejects need it
    from etl.config import DecodeStage, SourceConfig

SampleKey: TypeAlias = "int | str"
"""A sample by its `sample_id` (a str) or its position in the manifest (an int; -1 is the last)."""

# --- the dataset ------------------------------------------------------------------------------


def open_dataset(
    path: Path | str,
    version: int | None = None,
    *,
    cache_dir: Path | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    relative_to: Path | str = "",
) -> Dataset:
    """Open a dataset folder, a version folder or a manifest.arrow file (a relative one read
    from `relative_to`), read-only; or a dataset in object storage (`s3://bucket/ds`), through
    a local mirror in `cache_dir` (`etl.storage.store`: the version's files now, each shard
    verified when first read).

    The latest version unless `version` pins one; `ManifestError` if there is none or the
    manifest is not coherent (an unknown format version, a shard path outside the dataset, ...).
    """
    options = StoreOptions(cache_dir, storage_options or {})
    location = open_location(path, options, relative_to)
    manifest = read_manifest(location.root, location.fetch_version(version))
    return Dataset(manifest, location.store)


class Dataset(VersionContents):
    """One committed version of a packed dataset, for looking at: tables, arrays, images
    (`etl.format.contents.VersionContents`: classes, shape, layout, splits, counts, filters).

    Shards are opened on first use and kept open (read-only memmaps cost no memory until read).
    """

    def __init__(self, manifest: Manifest, store: StoreDataset | None = None) -> None:
        super().__init__(manifest)
        self._shards: dict[str, np.memmap] = {}
        self._store = store
        """Where shards come from when this is the mirror of a dataset in object storage."""
        self._others: dict[int, Dataset] = {}

    @property
    def url(self) -> str | None:
        """The dataset's URL in object storage; None for a local folder."""
        return self._store.url if self._store is not None else None

    @property
    def location(self) -> str:
        """Where the dataset is: its folder, or its URL in object storage."""
        return self._store.url if self._store is not None else str(self.root)

    @property
    def name(self) -> str:
        """The dataset's folder name (or the last part of its URL), for titles."""
        return PurePosixPath(self.location).name

    @property
    def versions(self) -> list[int]:
        """Every committed version of this dataset, oldest first."""
        return self._store.versions() if self._store else list_versions(self.root)

    def at_version(self, version: int) -> Dataset:
        """Another committed version of the same dataset (fetched first from a store), opened
        once and kept."""
        if version == self.version:
            return self
        if version not in self._others:
            number = self._store.fetch_version(version) if self._store else version
            self._others[version] = Dataset(read_manifest(self.manifest.root, number), self._store)
        return self._others[version]

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.sample_shape)
        return (
            f"<Dataset {self.location!r} version {self.version}: {len(self)} samples, "
            f"{len(self.classes)} classes, {shape} {self.layout}, "
            f"{self.rejects.num_rows} rejects>"
        )

    def to_pandas(self, rejects: bool = False) -> Any:
        """The manifest (or with `rejects=True` the rejects table) as a pandas DataFrame."""
        table = self.rejects if rejects else self.table
        try:
            return table.to_pandas()
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"to_pandas() needs pandas ({exc}); pip install pandas, or use .table (Arrow)"
            ) from None

    # -- one sample ----------------------------------------------------------------------------

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.table.column("sample_id").to_pylist())}

    def position(self, key: SampleKey) -> int:
        """Row of a sample in `table`, from its sample_id or a (possibly negative) position."""
        if isinstance(key, str):
            found = self._positions.get(key)
            if found is None:
                raise EtlError(f"{self.manifest.path}: no sample with sample_id {key!r}")
            return found
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise TypeError(f"a sample is a sample_id (str) or a position (int), not {key!r}")
        n = len(self)
        if not -n <= int(key) < n:
            raise IndexError(f"position {key} is outside the {n} samples of version {self.version}")
        return int(key) % n

    def row(self, key: SampleKey) -> dict[str, Any]:
        """The manifest row of one sample as a dict."""
        row: dict[str, Any] = self.table.slice(self.position(key), 1).to_pylist()[0]
        return row

    def array(self, key: SampleKey, longest: int | None = None) -> NDArray[np.uint8]:
        """The stored pixels of one sample, read-only, in the stored layout (`sample_shape`);
        with `longest`, a preview that size or larger (a JPEG decoded at a reduced scale:
        `etl.format.flat.stored_sample`)."""
        row = self.row(key)
        place = place_of(row) if self.manifest.meta.ragged else None
        try:
            pixels = stored_sample(
                self._shard(row["shard"]),
                row["row"],
                place,
                self.sample_shape,
                self.layout,
                encoding_of(row),
                longest,
            )
        except ValueError as exc:  # past the end (a file changed since opening), or undecodable
            raise ShardError(f"{self.manifest.shard_path(row['shard'])}: {exc}") from None
        return np.asarray(pixels)

    def image(self, key: SampleKey, longest: int | None = None) -> Image.Image:
        """One sample as a PIL image: RGB, or L for one channel; CHW is transposed for display.
        `longest`: a preview for a picture that size (see `array`)."""
        return to_image(self.array(key, longest), self.layout)

    def _shard(self, name: str) -> np.memmap:
        if name not in self._shards:
            shard = self.shards.filter(pc.field("shard") == name)
            rows = shard.column("rows").to_pylist()
            if self._store is not None:
                checksums = tuple(shard.column("checksum").to_pylist())
                sizes = tuple(shard.column("bytes").to_pylist())
                self._store.fetch_shards((name,), checksums, self.manifest.meta.checksum, sizes)
            self._shards[name] = open_shard(
                self.manifest.shard_path(name), self.manifest.meta.stored_shape, rows[0]
            )
        return self._shards[name]

    # -- summaries -----------------------------------------------------------------------------

    def summary(self) -> Summary:
        """What `etl inspect` shows: counts, shards, versions, rejects and the output config."""
        return summarize(self, self.location, self.versions)

    # -- choosing and drawing ------------------------------------------------------------------

    def pick(
        self,
        n: int = 16,
        seed: int = 0,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        ids: Sequence[str] | None = None,
        where: Where | None = None,
    ) -> list[int]:
        """Positions of samples to show. `ids`: exactly those, in that order. Otherwise up to `n`
        drawn at random (a pure function of `seed`) from those in `split` and `classes` that
        pass `where` (see `VersionContents.mask`), in manifest order. An unknown split, class or id
        is an error naming the valid ones."""
        if ids is not None:
            if split is not None or classes is not None or where is not None:
                raise ValueError("choose samples by ids, or by split, classes and where, not both")
            return [self.position(sid) for sid in ids]
        mask = self.mask(split, classes, where)
        candidates = np.flatnonzero(mask)
        if len(candidates) == 0:
            raise EtlError(f"no sample of version {self.version} matches the filters")
        rng = np.random.default_rng(seed)
        chosen = rng.choice(candidates, size=min(n, len(candidates)), replace=False)
        return sorted(int(p) for p in chosen)

    def contact_sheet(
        self,
        n: int = 16,
        seed: int = 0,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        ids: Sequence[str] | None = None,
        columns: int | None = None,
        cell: int = 128,
        where: Where | None = None,
        shown: Sequence[str] = (),
    ) -> Sheet:
        """Samples chosen by `pick`, each captioned with its class, split and sample id, and
        the values of the per-sample columns named in `shown` (a caption, a score)."""
        unknown = sorted(set(shown) - {f.name for f in self.manifest.meta.column_fields})
        if unknown:
            declared = [f.name for f in self.manifest.meta.column_fields] or "none"
            raise EtlError(f"no per-sample column {unknown}; this version's: {declared}")
        positions = self.pick(n, seed, split, classes, ids, where)
        rows = self.table.take(positions).to_pylist()
        cells = [
            Cell(
                image=self.image(p, longest=cell),
                caption=(
                    f"{r['class_name']} ({r['split']})",
                    r["sample_id"],
                    *(f"{name}: {r[name]}" for name in shown),
                ),
                info={
                    "position": p,
                    "sample_id": r["sample_id"],
                    "class_name": r["class_name"],
                    "split": r["split"],
                    "source": r["source"],
                    **{name: r[name] for name in shown},
                },
            )
            for p, r in zip(positions, rows, strict=True)
        ]
        title = f"{self.name} v{self.version}: {len(cells)} of {len(self)} samples"
        return draw_sheet(cells, columns=columns, cell=cell, title=title)

    def reject_sheet(
        self,
        source: Path | str | SourceConfig,
        decode: DecodeStage | None = None,
        n: int = 16,
        seed: int = 0,
        reasons: Sequence[str] | None = None,
        columns: int | None = None,
        cell: int = 128,
    ) -> Sheet:
        """Thumbnails of rejected sources, captioned with the reason. `source`: the source
        config the dataset was packed from (any kind; `load_config(...).source`), or the folder
        its sources' paths are relative to.

        A source is decoded as the pipeline does (`decode`: the config's decode stage, default
        RGB), so decompression bombs stay refused; one that cannot be read or decoded, or that
        lies outside the source root, gets a placeholder cell saying why. Up to `n` rejects drawn
        at random by `seed`, in source order; `reasons` keeps only those reasons.
        """
        table = self.rejects
        if reasons is not None:
            known = set(table.column("reason").to_pylist())
            unknown = sorted(set(reasons) - known)
            if unknown:
                raise EtlError(f"no reject with reason {unknown}; reasons: {sorted(known)}")
            table = table.filter(pc.is_in(table.column("reason"), pa.array(list(reasons))))
        if table.num_rows == 0:
            raise EtlError(f"version {self.version} has no rejects to show")
        rng = np.random.default_rng(seed)
        take = rng.choice(table.num_rows, size=min(n, table.num_rows), replace=False)
        rows = table.take(sorted(int(i) for i in take)).to_pylist()
        if decode is None:
            from etl.config import DecodeStage

            decode = DecodeStage()
        if isinstance(source, Path | str):
            from etl.config import FolderSource

            source = FolderSource(path=Path(source))
        cells = reject_cells(source, rows, decode, self.manifest.meta.checksum)
        title = f"{self.name} v{self.version}: {len(cells)} of {self.rejects.num_rows} rejects"
        return draw_sheet(cells, columns=columns, cell=cell, title=title)

    def class_balance(self) -> Chart:
        """A grouped bar chart of samples per class, one bar per split."""
        title = f"{self.name} v{self.version}: {len(self)} samples per class and split"
        return draw_class_balance(self.counts(), self.classes, title)


def to_image(array: NDArray[np.uint8], layout: str) -> Image.Image:
    """A stored sample -> PIL image: CHW is transposed to HWC; one channel becomes mode L."""
    if array.ndim != 3 or layout not in ("HWC", "CHW"):
        raise ValueError(f"expected a 3-d {layout} sample, got shape {array.shape}")
    hwc = array.transpose(1, 2, 0) if layout == "CHW" else array
    if hwc.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(hwc[:, :, 0]))
    if hwc.shape[2] == 3:
        return Image.fromarray(np.ascontiguousarray(hwc))
    raise ValueError(f"cannot show a sample with {hwc.shape[2]} channels")
