"""Docstrings and comments name what exists: every dotted name `etl.x.y` / `loaders.x` and
every path `etl/x/y.py` written in the package's source resolves to a module, an attribute
of one, or a file. A rename that leaves its old name in a docstring fails here."""

from __future__ import annotations

import ast
import importlib
import io
import itertools
import re
import tokenize
from pathlib import Path

import etl

ROOT = Path(etl.__file__).parent.parent
DOTTED = re.compile(r"\b((?:etl|loaders)(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"\b((?:etl|loaders|tests|benchmarks|docs)/[\w/]+\.(?:py|md))\b")


def _resolves(dotted: str) -> bool:
    """A module, or an attribute (a class's attribute too) reached from the longest module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def prose_of(source: str) -> str:
    """The docstrings and comments of a module: what a reader takes as documentation (string
    values in code, such as Arrow metadata keys 'etl.version', are data, not names)."""
    pieces = [
        ast.get_docstring(node, clean=False) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in ast.walk(ast.parse(source)):  # attribute docstrings: a string after a name
        body = getattr(node, "body", None)
        for before, after in itertools.pairwise(body if isinstance(body, list) else []):
            if (
                isinstance(before, ast.Assign | ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                pieces.append(after.value.value)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    pieces += [token.string for token in tokens if token.type == tokenize.COMMENT]
    return "\n".join(pieces)


def names_in(text: str) -> tuple[set[str], set[str]]:
    dotted = {m.rstrip(".") for m in DOTTED.findall(text)}
    return dotted, set(PATH.findall(text))


def data_keys(sources: list[Path]) -> set[str]:
    """Dotted names the code writes as values (Arrow metadata keys such as b'etl.checksum'):
    a docstring that names one names a key, not a module."""
    keys = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                value = (
                    node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                )
                keys.update(DOTTED.findall(value))
    return keys


def test_every_dotted_name_and_path_in_the_source_resolves() -> None:
    sources = sorted([*(ROOT / "etl").rglob("*.py"), *(ROOT / "loaders").rglob("*.py")])
    assert len(sources) > 80
    keys = data_keys(sources)
    assert {"etl.checksum", "etl.audit"} <= keys
    unresolved: dict[str, list[str]] = {}
    seen = 0
    for source in sources:
        dotted, paths = names_in(prose_of(source.read_text()))
        seen += len(dotted) + len(paths)
        bad = [name for name in sorted(dotted - keys) if not _resolves(name)]
        bad += [path for path in sorted(paths) if not (ROOT / path).exists()]
        if bad:
            unresolved[source.relative_to(ROOT).as_posix()] = bad
    assert seen > 100
    assert unresolved == {}


def test_the_check_finds_a_stale_name() -> None:
    module = (
        '"""see `etl.sources.records` and etl/names.py"""\n'
        'KEY = "etl.version"  # `etl.run.plan.Plan`\n'
    )
    dotted, paths = names_in(prose_of(module))
    assert dotted == {"etl.sources.records", "etl.run.plan.Plan"}
    assert [name for name in sorted(dotted) if not _resolves(name)] == ["etl.sources.records"]
    assert paths == {"etl/names.py"} and not (ROOT / "etl/names.py").exists()
