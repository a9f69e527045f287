"""What a pack worker pays before its first photo (#60): a fresh interpreter that unpickles the
exact task a run sends its workers, against one that imports only what decoding needs.

    python -m benchmarks.pack.worker_start [--rounds 7]

A run of `etl run` over a few generated photos is made in this process with `parallel_map`
wrapped, so the first task of each parallel phase (hashing, packing) is pickled as joblib sends
it: the function by reference, its task and its arguments. Then, in interleaved rounds, fresh
`python` processes time (from inside, so the interpreter's own start is the same in each):

    floor   import numpy, PIL.Image, simplejpeg, xxhash (what a decode needs)
    hash    pickle.loads of the hash phase's first task
    pack    pickle.loads of the pack phase's first task

and each says which of pydantic, pyarrow, yaml and joblib.parallel it imported on the way. No
result is asserted; the figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_model
from benchmarks.photos import make_photos

HEAVY = ("pydantic", "pyarrow", "yaml", "joblib.parallel", "etl.config")

PROBE = """
import pickle, sys, time
start = time.perf_counter()
{body}
took = time.perf_counter() - start
print(repr((took, [m for m in {heavy!r} if m in sys.modules])))
"""


@contextmanager
def captured(into: dict[str, bytes]) -> Iterator[None]:
    """While open, each parallel phase's first task is kept in `into` (by the function's name)
    pickled as joblib sends it."""
    from etl.engine import parallel

    original = parallel.parallel_map

    def keeping(fn: Any, tasks: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
        first = next(iter(tasks), None)
        if first is not None:
            into.setdefault(fn.__name__, pickle.dumps((fn, first, args)))
        return original(fn, tasks, run, *args, **kwargs)

    users = [m for m in list(sys.modules.values()) if getattr(m, "parallel_map", None) is original]
    for module in users:
        module.parallel_map = keeping  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in users:
            module.parallel_map = original  # type: ignore[attr-defined]


def payloads(work: Path) -> dict[str, bytes]:
    """The pickled first task of the hash and pack phases of a small real run."""
    import etl.run.execute  # noqa: F401  (the module that calls parallel_map)
    from etl.config import load_config
    from etl.run.pipeline import run

    make_photos(work / "photos", 24)
    photos = work / "photos"
    config_file = work / "pipeline.yaml"
    config_file.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(photos))}}}\n"
        "stages: [decode: {}, resize: {size: [224, 224]}]\n"
        f"output: {{dir: {json.dumps(str(work / 'out'))}}}\n"
        "run: {n_jobs: 2, backend: loky}\n"
    )
    found: dict[str, bytes] = {}
    with captured(found):
        run(load_config(config_file))
    return found


def probe(body: str) -> tuple[float, list[str]]:
    code = PROBE.format(body=body, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    took, heavy = eval(done.stdout.strip().splitlines()[-1])  # our own repr of floats and str
    return float(took), list(heavy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        found = payloads(work)
        bodies = {"floor": "import numpy, PIL.Image, simplejpeg, xxhash"}
        for name, data in sorted(found.items()):
            path = work / f"{name}.pickle"
            path.write_bytes(data)
            bodies[name] = f"pickle.loads(open({str(path)!r}, 'rb').read())"
        seconds: dict[str, list[float]] = {name: [] for name in bodies}
        imported: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            for name, body in bodies.items():
                took, imported[name] = probe(body)
                seconds[name].append(took)
    print(f"# worker start-up: {cpu_model()}, Python {sys.version.split()[0]}, "
          f"{args.rounds} rounds (median)")  # fmt: skip
    floor = statistics.median(seconds["floor"])
    print("| what | seconds | x floor | imports of " + ", ".join(HEAVY) + " |")
    print("|---|---:|---:|---|")
    for name, values in seconds.items():
        median = statistics.median(values)
        heavy = ", ".join(imported[name]) or "none"
        print(f"| {name} | {median:.3f} | {median / floor:.1f} | {heavy} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
