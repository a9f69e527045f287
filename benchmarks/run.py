"""Run every benchmark whose results are in benchmarks/README.md, one after another (`make bench`).

Each runs in its own process so that one's page cache and worker pools do not colour the next
one's numbers more than the machine already does.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "pack.throughput",
    "pack.grid",
    "pack.rejects",
    "load.throughput",
    "load.workers",
    "pack.incremental",
    "maintain.audit",
    "pack.on_dask",
    "pack.from_lmdb",
    "pack.sources",
    "load.augment",
    "formats.scale",
    "pack.tree",
    "load.cold",
    "load.verify_rows",
    "formats.columns",
    "load.mixture",
    "formats.aspect",
    "maintain.report",
    "pack.worker_start",
    "pack.original",
    "gpu.device_decode",
)


def main() -> None:
    failed = []
    for name in sys.argv[1:] or BENCHMARKS:
        print(f"\n## {name}\n", flush=True)
        if subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], check=False).returncode:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
