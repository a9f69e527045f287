"""What every benchmark prints about the machine it ran on."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from collections.abc import Iterable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import numpy as np


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def peak_rss(pid: int) -> int:
    """VmHWM (the kernel's exact peak RSS) of a running process in bytes; 0 if it cannot be
    read. Not `ru_maxrss`: that keeps the peak of the parent a child was forked from."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_MEASURED = """
import atexit, os, runpy, sys
from benchmarks.common import peak_rss
atexit.register(lambda: open(os.environ["BENCH_PEAK_FILE"], "w").write(str(peak_rss(os.getpid()))))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_measured(module: str, *args: str) -> tuple[float, int, int, str]:
    """`python -m module args...` in a fresh interpreter: (wall seconds, its own peak RSS in
    bytes, exit status, stdout). The child reads its VmHWM at exit; `wait4`'s ru_maxrss would
    report the benchmark's own peak too (a spawned child inherits its parent's high-water mark
    across exec)."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    with tempfile.NamedTemporaryFile("r") as peak, tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        status = subprocess.call(
            [sys.executable, "-c", _MEASURED, module, *args],
            stdout=out,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "BENCH_PEAK_FILE": peak.name},
        )
        seconds = time.perf_counter() - started
        out.seek(0)
        rss = int(peak.read() or 0)
        return seconds, rss, status, out.read()


def cached_bytes(paths: list[Path]) -> int:
    """Bytes of these files in the page cache: `mincore` over a fresh read-only mapping of
    each (Linux; 0 where it cannot tell)."""
    import ctypes
    import mmap

    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    cached = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        state = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = np.frombuffer(mapped, dtype=np.uint8)
            failed = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), state)
            del view
        if failed:
            return 0
        cached += min(size, sum(s & 1 for s in state) * mmap.PAGESIZE)
    return cached


def loader_rate(loader: Iterable[Any]) -> float:
    """Samples per second of one pass over `loader` (its batches' labels counted)."""
    start = time.perf_counter()
    count = sum(len(batch.labels) for batch in loader)
    return count / (time.perf_counter() - start)


def synthetic_options(doc: str, samples: int, size: int, rounds: int) -> argparse.Namespace:
    """--samples, --size, --rounds (and --steps, where a benchmark counts steps) of a loader
    benchmark over synthetic samples; its description the first paragraph of `doc`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=samples)
    parser.add_argument("--size", type=int, default=size)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=10_000)
    return parser.parse_args()


def machine_info() -> dict[str, Any]:
    """The machine and library versions a benchmark's figures were measured with."""
    model = cpu_model()
    return {
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu": model,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pillow": package_version("pillow"),
        "numpy": np.__version__,
        "joblib": package_version("joblib"),
        "date": datetime.date.today().isoformat(),
        "load_before": os.getloadavg()[0],
    }


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
