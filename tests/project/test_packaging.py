"""The layers install apart (pyproject.toml's extras): a training node imports the format and
the loaders without the ETL's packages, a packing node never imports torch, and the `etl`
command without its packages says in one line how to get them."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from etl.cli import ETL_PACKAGES
from etl.config import load_config
from etl.run import pipeline
from tests.helpers.codecs import write_config, write_photos

ROOT = Path(__file__).resolve().parents[2]

IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml"}
"""Distribution -> top-level module, where the two differ."""


def imported_by(code: str) -> set[str]:
    """Top-level modules a fresh interpreter has imported after `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return {name.split(".")[0] for name in json.loads(proc.stdout)}


def _extra(name: str | None) -> set[str]:
    """Top-level modules of one extra of pyproject.toml (None: the core), by import name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] if name is None else project["optional-dependencies"][name]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in listed}
    return {IMPORT_NAMES.get(n, n) for n in names}


def test_the_etl_extra_is_what_the_cli_checks_for() -> None:
    assert _extra("etl") == ETL_PACKAGES
    assert _extra(None) == {"numpy", "pyarrow", "xxhash", "blake3"}  # the format, nothing more


def test_a_training_node_needs_only_the_format_and_torch() -> None:
    found = imported_by(
        "import loaders\nfrom loaders import PackedDataset\n"
        "from loaders.read.catalog import open_catalog"
    )
    assert "torch" in found
    assert not found & ETL_PACKAGES, found & ETL_PACKAGES


@pytest.mark.timeout(180)
def test_a_training_node_decodes_stored_samples_with_its_own_extra(tmp_path: Path) -> None:
    """A JPEG and a zlib dataset read on a node that installed `[loaders]` alone: every ETL
    package that extra lacks is made unimportable in a fresh interpreter, which then reads
    every sample whole, cropped in two workers, and sent encoded for the device's decode."""
    for codec in ("jpeg", "zlib"):
        write_photos(tmp_path / codec / "images", count=6)
        config = write_config(tmp_path / codec, codec)
        assert pipeline.run(load_config(config)).committed
    missing = sorted(ETL_PACKAGES - _extra("loaders"))
    assert "PIL" in missing and "simplejpeg" not in missing  # libjpeg-turbo joins [loaders]
    code = "\n".join(
        [
            "import sys",
            *(f"sys.modules[{name!r}] = None" for name in missing),
            "from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader",
            "for codec in ('jpeg', 'zlib'):",
            f"    ds = PackedDataset.open({str(tmp_path)!r} + '/' + codec + '/out')",
            "    assert all(tuple(ds[i][0].shape) == (32, 40, 3) for i in range(len(ds)))",
            "    cropped = make_loader(ds.with_crop(RandomResizedCrop(16)), batch_size=3,",
            "                          num_workers=2, workers_as='processes')",
            "    assert sum(len(images) for images, _ in cropped) == len(ds)",
            "    device = DeviceLoader(make_loader(ds, batch_size=3), device='cpu',",
            "                          augment=RandomResizedCrop(16), decode='device')",
            "    assert sum(len(batch[1]) for batch in device) == len(ds)",
            "print('read')",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=150, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "read", proc.stderr


def test_a_packing_node_never_imports_torch() -> None:
    code = (
        "import etl.cli, etl.run.pipeline, etl.maintenance.checkup, etl.explore.dataset\n"
        "import contextlib, io\nfrom etl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    )
    assert "torch" not in imported_by(code)


def test_the_cli_without_its_packages_says_how_to_install_them() -> None:
    code = "import sys\nsys.modules['typer'] = None\nfrom etl.cli import main\nmain(['--help'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "error: the etl command needs the ETL packages (typer is missing): "
        "pip install 'etl-memmap[etl]'"
    )


# The floors of the house, lowest first: a module imports only from floors below its own, and
# from its own package (docs/architecture.md, "Floors"). `etl` alone is its package's
# __init__, which opens `etl.open_dataset` lazily.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("etl.errors", "etl.deprecations"),
    ("etl.progress", "etl.yaml_file"),
    ("etl.format",),
    ("etl.storage",),
    ("etl.config",),
    ("etl.images",),
    ("etl.sources",),
    ("etl.engine",),
    ("etl.run",),
    ("etl.explore",),
    ("etl.maintenance", "etl.start", "loaders"),
    ("etl.report",),
    ("etl.cli",),
    ("etl.__main__", "etl"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*(ROOT / "etl").rglob("*.py"), *(ROOT / "loaders").rglob("*.py")]):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Every module of ours that `path` imports anywhere: at the top, in a function, or for
    type checking only (a cycle there is still two modules that need each other)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
            found |= submodules  # `from pkg import submodule` imports the submodule
            if len(submodules) < len(node.names):
                found.add(base)
    return {m for m in found if m in modules and m != name}


# The rooms of the loaders, lowest first, on the same rule: a room imports only from the rooms
# below its own and from itself; two rooms on one floor never import each other. `loaders`
# alone (its __init__, the front door) stands above them all (docs/architecture.md, "Floors").
LOADER_FLOORS: tuple[tuple[str, ...], ...] = (
    ("batch",),
    ("read",),
    ("memory", "augment"),
    ("order",),
    ("datasets",),
    ("loader",),
    ("device",),
    ("trainers",),
)


def _floor(module: str) -> int:
    for level, prefixes in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "etl"):
            return level
    assert module == "etl", f"{module} stands on no floor: add its package to FLOORS"
    return len(FLOORS) - 1


def _loader_floor(module: str) -> int:
    """A module's floor among the loaders' rooms (the front door: above them all)."""
    if module == "loaders":
        return len(LOADER_FLOORS)
    room = module.split(".")[1]
    found = [level for level, rooms in enumerate(LOADER_FLOORS) if room in rooms]
    assert found, f"{module} is in no room: add its folder to LOADER_FLOORS"
    return found[0]


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _reaches_up(name: str, target: str) -> bool:
    """Whether `name` importing `target` reaches up or sideways (not within its own package)."""
    if _package(target) == _package(name):
        return False
    if target.startswith("loaders") and name.startswith("loaders"):
        return _loader_floor(target) >= _loader_floor(name)
    return _floor(target) >= _floor(name)


def test_imports_run_down_the_floors() -> None:
    """No module imports from a floor above its own (a source borrowing the run's spill, the
    loaders reaching into the run, an order reaching into the DataLoader): the data flows one
    way, and a lower floor installs and imports without the ones above it."""
    modules = _modules()
    upward = [
        f"{name} imports {target}"
        for name, path in modules.items()
        for target in _imported(path, name, modules)
        if _reaches_up(name, target)
    ]
    assert not upward, upward


def _circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative): sets
    of modules each of which imports, through the others, every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for root in sorted(imports):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(sorted(imports[root])))]
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None and target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(imports.get(target, ())))))
            elif target is not None:
                if target in stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    at = stack.index(node)
                    component, stack[at:] = stack[at:], []
                    if len(component) > 1:
                        circles.append(sorted(component))
    return sorted(circles)


def test_no_modules_import_each_other_in_a_circle_of_any_length() -> None:
    """No set of modules imports itself round (a pair, or `factories` -> `loader` -> `trace` ->
    `factories`, which a check of pairs let through): each module can be read, tested and moved
    knowing only the ones it stands on."""
    modules = _modules()
    circles = _circles({name: _imported(path, name, modules) for name, path in modules.items()})
    assert not circles, circles


def test_the_circle_check_finds_loops_of_every_length() -> None:
    """The check on a made-up graph: a loop of three and a pair are found, a chain into a loop
    and a module alone are not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert _circles(graph) == [["a", "b", "c"], ["d", "e"]]


def test_the_storage_package_sits_between_the_format_and_the_run() -> None:
    """Object storage imports the format (manifest, record, checksums), never the run; the
    format imports neither the storage package nor fsspec, so a folder reader needs neither."""
    code = "\n".join(f"import {m}" for m in _modules() if m.startswith("etl.storage"))
    assert not {"etl.run", "torch"} & _imported_names(code), code
    format_code = "\n".join(f"import {m}" for m in _modules() if m.startswith("etl.format"))
    found = _imported_names(format_code)
    assert "fsspec" not in found and "etl.storage" not in found, sorted(found)


def _imported_names(code: str) -> set[str]:
    """Modules (and their packages, `etl.run` for `etl.run.phases`) a fresh interpreter has
    imported after `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout)
    return {".".join(n.split(".")[:k]) for n in names for k in (1, 2)}


URL_SNIFF = re.compile(r"^[a-z0-9+.-]*://$")
"""A string literal that tells a URL by its text: `"://"`, or a scheme such as `"file://"`."""


def _url_decisions(tree: ast.AST) -> list[str]:
    """What in a module decides local-or-URL by itself: `is_url` imported (under any name) or
    reached as an attribute, a literal that sniffs a URL's text."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "is_url" for a in node.names):
            found.append(f"line {node.lineno}: imports is_url")
        elif isinstance(node, ast.Attribute) and node.attr == "is_url":
            found.append(f"line {node.lineno}: .is_url")
        elif isinstance(node, ast.Constant) and URL_SNIFF.match(str(node.value)):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_only_the_storage_package_decides_local_or_url() -> None:
    """`is_url` is defined in `etl.storage.location` alone, and no module outside
    `etl.storage` imports it (by any name) or tells a URL by its text (a `"://"` or
    `"file://"` literal): text becomes a `StoreUrl` or a `Path` once (`as_location`, the
    config's fields), and the rest branches on that type."""
    modules = _modules()
    defined = [n for n, p in modules.items() if re.search(r"^def is_url\(", p.read_text(), re.M)]
    assert defined == ["etl.storage.location"], defined
    deciding = {
        name: found
        for name, path in modules.items()
        if not name.startswith("etl.storage")
        and (found := _url_decisions(ast.parse(path.read_text())))
    }
    assert not deciding, deciding


def test_the_url_rule_catches_each_way_of_deciding() -> None:
    """The check on made-up modules: each way of deciding by text is found, prose is not."""
    for code in (
        "from etl.storage.location import is_url as remote",
        "import etl.storage.location as loc\nloc.is_url(x)",
        'x = "://" in text',
        'x = text.removeprefix("file://")',
    ):
        assert _url_decisions(ast.parse(code)), code
    prose = 'def f():\n    """A URL such as s3://bucket/prefix."""\n    return "tcp://a:1"'
    assert not _url_decisions(ast.parse(prose))


MODULE_LINES = 400
FUNCTION_LINES = 60
CLASS_LINES = 250


def _sized(paths: dict[str, Path]) -> tuple[list[str], list[str], list[str]]:
    """The modules, functions and classes of `paths` over the limits, each with its length."""
    long_modules, long_functions, long_classes = [], [], []
    for name, path in paths.items():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            length = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if length > FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {length} lines")
            elif isinstance(node, ast.ClassDef) and length > CLASS_LINES:
                long_classes.append(f"{name}.{node.name}: {length} lines")
    return long_modules, long_functions, long_classes


def test_no_module_over_400_lines_no_function_over_60_no_class_over_250() -> None:
    """A module that outgrows 400 lines has grown a second job, a function over 60 lines a
    second step, a class over 250 a second responsibility: split along the seam, which the
    new module's docstring names (docs/architecture.md, "Rooms"). In etl/, loaders/ and
    benchmarks/ alike."""
    benchmarks = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for path in sorted((ROOT / "benchmarks").rglob("*.py"))
    }
    long_modules, long_functions, long_classes = _sized({**_modules(), **benchmarks})
    assert not long_modules, long_modules
    assert not long_functions, long_functions
    assert not long_classes, long_classes


def test_the_limits_see_what_they_limit() -> None:
    """The size check finds a long module, function and class (of code made here)."""
    import tempfile

    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    code = f"def long():\n{body}\n\nclass Big:\n" + "\n".join(
        f"    def m{i}(self):\n        return {i}\n" for i in range(CLASS_LINES // 3 + 1)
    )
    code += "\n" * (MODULE_LINES - code.count("\n") + 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.py"
        path.write_text(code)
        modules, functions, classes = _sized({"big": path})
    assert modules and functions == ["big.long: 61 lines"] and classes, (modules, classes)


def test_every_package_docstring_lists_its_modules() -> None:
    """Each package's docstring has a `Modules:` list, one line a module or subpackage
    (`- \\`name\\`: what it is for`), naming exactly what the folder holds: a new module is
    listed where a reader looks first, and a moved one leaves no stale line."""
    wrong = {}
    inits = [
        *(ROOT / "etl").rglob("__init__.py"),
        *(ROOT / "loaders").rglob("__init__.py"),
        *(ROOT / "benchmarks").rglob("__init__.py"),
    ]
    for init in sorted(inits):
        folder = init.parent
        held = {p.stem for p in folder.glob("*.py") if not p.name.startswith("__")}
        held |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        _, found, listing = doc.partition("\nModules:\n")
        listed = re.findall(r"^- `([\w]+/?)`: +\S", listing, re.M) if found else []
        if sorted(listed) != sorted(held) or len(listed) != len(listing.strip().splitlines()):
            wrong[str(folder.relative_to(ROOT))] = sorted(set(listed) ^ held)
    assert not wrong, wrong


MOVED = {
    "etl/format/remote.py": "etl/storage/store.py",
    "etl/format/cache.py": "etl/storage/cache.py",
    "etl/format/ranged.py": "etl/storage/ranged.py",
    "etl/format/publish.py": "etl/storage/publish.py",
    "etl/format/view.py": "etl/format/contents.py",
    "etl/format/columns.py": "etl/format/table_ops.py",
    "etl/format/rowsums.py": "etl/format/row_checksums.py",
    "etl/run/spill.py": "etl/format/spill.py",
    "etl/run/buckets.py": "etl/run/hash_buckets.py",
    "etl/explore/view.py": "etl/explore/dataset.py",
    "etl/sources/objects.py": "etl/sources/in_store.py",
    "loaders/rowchecks.py": "loaders/read/row_checks.py",
    "loaders/buckets.py": "loaders/order/aspect_buckets.py",
    "etl/format/ragged.py": "etl/format/flat.py",
}
"""Modules moved by #56, old path -> new: the old path must stay empty."""

MOVED_TO_ROOMS = {
    "loaders/batches.py": "loaders/batch/types.py",
    "loaders/ragged.py": "loaders/batch/ragged.py",
    "loaders/catalog.py": "loaders/read/catalog.py",
    "loaders/reader.py": "loaders/read/reader.py",
    "loaders/span.py": "loaders/read/span.py",
    "loaders/shard_checks.py": "loaders/read/shard_checks.py",
    "loaders/row_checks.py": "loaders/read/row_checks.py",
    "loaders/page_cache.py": "loaders/read/page_cache.py",
    "loaders/batch_plan.py": "loaders/read/batch_plan.py",
    "loaders/ragged_rows.py": "loaders/read/flat_rows.py",
    "loaders/memory.py": "loaders/memory/batch_memory.py",
    "loaders/ring.py": "loaders/memory/ring.py",
    "loaders/pinning.py": "loaders/memory/pinning.py",
    "loaders/augment.py": "loaders/augment/crops.py",
    "loaders/worker_crop.py": "loaders/augment/worker_crop.py",
    "loaders/orders.py": "loaders/order/orders.py",
    "loaders/samplers.py": "loaders/order/samplers.py",
    "loaders/mixture_orders.py": "loaders/order/mixture_orders.py",
    "loaders/mixture_trace.py": "loaders/order/mixture_trace.py",
    "loaders/aspect_buckets.py": "loaders/order/aspect_buckets.py",
    "loaders/dist.py": "loaders/order/world.py",
    "loaders/resume.py": "loaders/order/resume.py",
    "loaders/quality.py": "loaders/order/quality.py",
    "loaders/dataset.py": "loaders/datasets/packed.py",
    "loaders/stream.py": "loaders/datasets/stream.py",
    "loaders/mixture.py": "loaders/datasets/mixture.py",
    "loaders/joined_reader.py": "loaders/datasets/joined_reader.py",
    "loaders/opening.py": "loaders/datasets/opening.py",
    "loaders/loader.py": "loaders/loader/packed.py",
    "loaders/factories.py": "loaders/loader/factories.py",
    "loaders/named_orders.py": "loaders/loader/named_orders.py",
    "loaders/workers.py": "loaders/loader/workers.py",
    "loaders/trace.py": "loaders/loader/trace.py",
    "loaders/device.py": "loaders/device/loader.py",
    "loaders/device_decode.py": "loaders/device/decode.py",
}
"""The loaders' modules moved into rooms by #72, old path -> new (`loaders/memory.py` became
the room `loaders/memory/`: a `memory.py` must not come back beside it)."""


def test_a_moved_module_leaves_no_shim_at_its_old_path() -> None:
    """A module that re-exports a moved one would keep two names for one thing alive (and
    the import it hides past the floors test); importers change instead."""
    moved = {**MOVED, **MOVED_TO_ROOMS}
    left = [old for old in moved if (ROOT / old).exists()]
    assert not left, left
    assert all((ROOT / new).is_file() for new in moved.values())
