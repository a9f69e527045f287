"""Pack images into uint8 .npy shards with an Arrow manifest (see README.md and docs/FORMAT.md).

`etl.open_dataset(path)` opens a packed dataset for a look (`etl.explore.dataset`); it is imported
on first use, so `import etl` stays cheap (no numpy, pyarrow or Pillow until needed).

Modules:
- `cli/`:         the `etl` command line, one thin module per capability
- `config/`:      the pipeline.yaml schema: frozen models, errors with key and line
- `deprecations`: renamed public names that still work, each warning once
- `engine/`:      what runs work: the parallel map, workers, the Dask cluster, interrupts
- `errors`:       one error class per failure a user can cause
- `explore/`:     looking at a packed dataset: tables, images, contact sheets
- `format/`:      every rule about what lies on disk in a dataset folder
- `images/`:      pure per-image work: decode, check, resize; the reject reasons
- `maintenance/`: audit, repair, compaction and a dataset's history
- `progress`:     what long work tells its caller: phases, totals, advances
- `report/`:      a version as one self-contained HTML page, for a browser
- `run/`:         one run: list, hash, plan, pack, commit, and publishing to a store
- `sources/`:     the inputs: a unit per source kind, one registry, what they share
- `start/`:       starting a project: `etl init` and the sample images
- `storage/`:     object storage: where a dataset is, the store, its cache, publishing
- `yaml_file`:    the one safe YAML reader (pipeline.yaml, view files)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl.explore.dataset import open_dataset

__all__ = ["open_dataset"]


def __getattr__(name: str) -> Any:
    # NOTE: PEP 562 lazy attribute; `from etl import open_dataset` works the same way.
    if name == "open_dataset":
        from etl.explore.dataset import open_dataset

        return open_dataset
    raise AttributeError(f"module 'etl' has no attribute {name!r}")
