"""Run every benchmark whose results are in benchmarks/README.md, one after another (`make bench`).

Each runs in its own process so that one's page cache and worker pools do not colour the next
one's numbers more than the machine already does.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "bench_pack",
    "bench_pack_grid",
    "bench_rejects",
    "bench_loaders",
    "bench_workers",
    "bench_incremental",
    "bench_audit",
    "bench_dask",
    "bench_lmdb",
    "bench_sources",
    "bench_augment",
    "bench_scale",
    "bench_tree",
    "bench_cold",
    "bench_verify_rows",
    "bench_columns",
    "bench_mixture",
    "bench_aspect",
    "bench_report",
    "bench_worker_start",
    "bench_original",
    "bench_device_decode",
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
