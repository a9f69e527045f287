"""One unit per source kind: the registry holds every kind the config accepts, each with its own
model, and no code outside the kinds, their registry and their config branches on a kind."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import etl
from etl.config.sources import SOURCE_KINDS, SourceConfig
from etl.sources.registry import KINDS, kind_named

PACKAGE = Path(etl.__file__).parent
ALLOWED = ("config/sources.py", "sources/registry.py", "sources/kinds/")
"""Where a kind may be named: its config model, the registry line, its own unit."""


def test_the_registry_holds_every_kind_the_config_accepts_with_its_own_model() -> None:
    models = get_args(SourceConfig)
    assert len(models) == 6 and len(KINDS) == len(models)
    assert tuple(KINDS) == SOURCE_KINDS
    assert {model.model_fields["kind"].default for model in models} == set(KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind_named(name) is kind
    assert kind_named("tfrecord") is None and kind_named(None) is None


def _kind_branches(tree: ast.AST) -> list[str]:
    """What in `tree` tests a kind: a comparison with a kind's name, a table keyed by kind
    names, an isinstance check against a source model, a comparison of a source's `.kind`
    (an audit finding's `.kind` is another thing)."""
    names = set(SOURCE_KINDS)
    models = {model.__name__ for model in get_args(SourceConfig)}
    found = []

    def kind_constants(node: ast.AST) -> bool:
        return any(isinstance(sub, ast.Constant) and sub.value in names for sub in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(kind_constants(part) for part in parts) or any(
                re.search(r"\b(source|config)\.kind$", ast.unparse(part)) for part in parts
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value in names for key in node.keys
        ):
            found.append(f"line {node.lineno}: a table keyed by kind names")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
            and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & models
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_outside_the_kinds_branches_on_a_kind() -> None:
    checked = 0
    branches = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(ALLOWED):
            continue
        checked += 1
        found = _kind_branches(ast.parse(path.read_text(), str(path)))
        if found:
            branches[relative] = found
    assert checked > 50
    assert branches == {}


def test_the_check_finds_a_branch_on_a_kind() -> None:
    """The scan above can fail: each form it looks for is found in a sample."""
    sample = (
        "if config.kind == 'lmdb': pass\n"
        "if kind in {'folder', 'listing'}: pass\n"
        "READERS = {'python': read}\n"
        "if isinstance(source, FolderSource): pass\n"
        "if source.kind != other: pass\n"
    )
    assert len(_kind_branches(ast.parse(sample))) == 5
