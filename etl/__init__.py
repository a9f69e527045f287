"""Pack images into uint8 .npy shards with an Arrow manifest (see README.md and docs/FORMAT.md).

`etl.open_dataset(path)` opens a packed dataset for a look (`etl.explore.view`); it is imported on
first use, so `import etl` stays cheap (no numpy, pyarrow or Pillow until needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl.explore.view import open_dataset

__all__ = ["open_dataset"]


def __getattr__(name: str) -> Any:
    # NOTE: PEP 562 lazy attribute; `from etl import open_dataset` works the same way.
    if name == "open_dataset":
        from etl.explore.view import open_dataset

        return open_dataset
    raise AttributeError(f"module 'etl' has no attribute {name!r}")
