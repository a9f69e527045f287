"""The readers of a packed dataset, run one case after another in one long-lived process, for
tests/format/test_format_fuzz.py. Not a test module.

    python tests/format/fuzz_driver.py     # reads cases as JSON lines on stdin

A case is {"case": n, "root": dataset folder, "config": pipeline.yaml or null, "readers":
[names]}, or, for a dataset in object storage, {"case": n, "url": its URL, "cache": the cache
folder its mirror is in, "readers": [names]} (the store's endpoint and credentials come from
this process's environment); for each it writes one JSON line to stdout: {"case": n,
"results": {reader: result}},
where a result is {"code": exit code, "error": what was said, or "bug": a traceback}. Every
`etl` command runs in-process through `etl.cli.main`, as the console script would; the loaders
run as a training job would use them. A crash (a signal) ends this process: the test sees it
die on the case it sent last. Imports are paid once, not per case.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from etl.cli import main as etl_main  # noqa: E402
from etl.errors import EtlError  # noqa: E402
from etl.storage.location import StoreOptions  # noqa: E402
from loaders import (  # noqa: E402
    CenterCrop,
    DeviceLoader,
    PackedDataset,
    PackedStream,
    make_loader,
    stream_loader,
)
from loaders.read.catalog import open_catalog  # noqa: E402


def cli(*args: str) -> dict[str, Any]:
    """`etl ARGS` in this process: its exit code and what it printed on stderr."""
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            etl_main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        return {"code": None, "bug": traceback.format_exc()}
    said = err.getvalue()
    if "Traceback" in said or "Traceback" in out.getvalue():
        return {"code": code, "bug": said + out.getvalue()}
    return {"code": code, "error": said.strip()}


def python(read: Callable[[], None]) -> dict[str, Any]:
    """A loaders call: 0 when it read everything, 2 with the one line of an EtlError."""
    try:
        read()
    except EtlError as exc:
        return {"code": 2, "error": str(exc)}
    except BaseException:
        return {"code": None, "bug": traceback.format_exc()}
    return {"code": 0, "error": ""}


def read_all(root: str, workers: int = 0, **options: Any) -> None:
    dataset = PackedDataset.open(root, **options)
    loader = make_loader(
        dataset, batch_size=16, shuffle=True, num_workers=workers, workers_as="processes"
    )
    count = sum(len(batch.labels) for batch in loader)
    assert count == len(dataset), f"read {count} of {len(dataset)} samples"


def decode_all(root: str, **options: Any) -> None:
    """Every sample sent still encoded and decoded where the batch goes (on the CPU here, by
    nvImageCodec's native decoder: the GPU path's library), then cropped."""
    dataset = PackedDataset.open(root, **options)
    loader = make_loader(dataset, batch_size=16, shuffle=True, with_indices=True)
    device = DeviceLoader(
        loader, device="cpu", augment=CenterCrop(8), decode="device", decoder="nvimgcodec"
    )
    count = sum(len(batch[1]) for batch in device)
    assert count == len(dataset), f"decoded {count} of {len(dataset)} samples"


def stream_all(root: str, workers: int) -> None:
    selection = open_catalog(root).select()
    loader = stream_loader(PackedStream(selection, batch_size=8, window=2), num_workers=workers)
    count = sum(len(batch.labels) for batch in loader)
    assert count >= len(selection), f"streamed {count} of {len(selection)} samples"


def readers(root: str, config: str | None, scratch: Path) -> dict[str, Callable[[], Any]]:
    return {
        "audit": lambda: cli("audit", root, "--quiet"),
        "inspect": lambda: cli("inspect", root),
        "versions": lambda: cli("versions", root),
        "diff": lambda: cli("diff", root, "1", "2"),
        "show": lambda: cli("show", root, "-n", "4", "--out", str(scratch / "sheet.png")),
        "compact": lambda: cli("compact", root, "--dry-run"),
        "run": lambda: cli("run", str(config), "--jobs", "1", "--backend", "sequential"),
        "loaders": lambda: python(lambda: read_all(root)),
        "loaders-verify": lambda: python(lambda: read_all(root, verify="shards")),
        "loaders-rows": lambda: python(lambda: read_all(root, verify="rows")),
        "loaders-lenient": lambda: python(lambda: read_all(root, verify_manifest=False)),
        "loaders-unchecked": lambda: python(lambda: read_all(root, verify=False)),
        "loaders-workers": lambda: python(lambda: read_all(root, workers=2)),
        "loaders-device": lambda: python(lambda: decode_all(root)),
        "loaders-device-unchecked": lambda: python(lambda: decode_all(root, verify=False)),
        "loaders-columns": lambda: python(
            lambda: read_all(root, columns=["caption", "boxes", "meta"], where="score >= 1")
        ),
        "stream": lambda: python(lambda: stream_all(root, workers=0)),
        "stream-workers": lambda: python(lambda: stream_all(root, workers=2)),
    }


def read_from_store(url: str, workers: int = 0, **options: Any) -> None:
    """Every sample of the dataset at `url` through the mirror in $ETL_CACHE."""
    read_all(url, workers, **options)


def stream_from_store(url: str) -> None:
    selection = PackedDataset.open(url).selection
    loader = stream_loader(PackedStream(selection, batch_size=8, window=2))
    count = sum(len(batch.labels) for batch in loader)
    assert count >= len(selection), f"streamed {count} of {len(selection)} samples"


def store_readers(url: str, scratch: Path) -> dict[str, Callable[[], Any]]:
    """The readers of a dataset in object storage that read its mirror in the cache."""
    return {
        "inspect": lambda: cli("inspect", url),
        "versions": lambda: cli("versions", url),
        "diff": lambda: cli("diff", url, "1", "2"),
        "show": lambda: cli("show", url, "-n", "4", "--out", str(scratch / "sheet.png")),
        "loaders": lambda: python(lambda: read_from_store(url)),
        "loaders-verify": lambda: python(lambda: read_from_store(url, verify="shards")),
        "loaders-workers": lambda: python(lambda: read_from_store(url, workers=2)),
        "loaders-limited": lambda: python(
            lambda: read_from_store(url, store=StoreOptions(cache_limit="1GiB"))
        ),
        "stream": lambda: python(lambda: stream_from_store(url)),
    }


def main() -> None:
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    for line in sys.stdin:
        case = json.loads(line)
        with tempfile.TemporaryDirectory() as scratch:
            if "url" in case:
                os.environ["ETL_CACHE"] = case["cache"]
                every = store_readers(case["url"], Path(scratch))
            else:
                every = readers(case["root"], case.get("config"), Path(scratch))
            results = {}
            for name in case["readers"]:
                start = time.perf_counter()
                results[name] = {**every[name](), "seconds": time.perf_counter() - start}
        print(json.dumps({"case": case["case"], "results": results}), flush=True)


if __name__ == "__main__":
    main()
