"""The documentation stays true to the code: the README is a front door under 250 lines, every
relative link lands on a file, the reject-reason table lists exactly the reasons the code can
give, and the configuration reference names every key with the defaults the code has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from etl.config.fields import parse_byte_size
from etl.config.pipeline import PipelineConfig
from etl.images.rejects import REJECT_REASONS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_every_relative_link_lands_on_a_file() -> None:
    checked = 0
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"
            checked += 1
    assert checked > 10


def test_the_reject_table_lists_exactly_the_reasons_the_code_gives() -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    table = text[text.index("| reason | what it means |") :].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.strip().startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(REJECT_REASONS)


def _config_models() -> set[type[BaseModel]]:
    """Every model a pipeline.yaml is made of, the union members of `source` and `stages` too."""

    def annotations(t: object) -> list[object]:
        return [t, *(a for arg in get_args(t) for a in annotations(arg))]

    found: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [PipelineConfig]
    while todo:
        model = todo.pop()
        if model not in found:
            found.add(model)
            todo += [
                t
                for field in model.model_fields.values()
                for t in annotations(field.annotation)
                if isinstance(t, type) and issubclass(t, BaseModel)
            ]
    return found


def test_every_config_key_is_documented_and_every_stated_default_is_the_code_s() -> None:
    """The configuration reference names every key of every model (in prose or in a YAML
    example), and each "`key` (default `X`)" it states is that key's default in the code."""
    text = "\n".join(
        (ROOT / "docs" / page).read_text() for page in ("configuration.md", "sources.md")
    )
    models = _config_models()
    assert len(models) >= 12
    keys = {
        (model.__name__, field.alias or name)  # a YAML key spelt as an alias: `from`
        for model in models
        for name, field in model.model_fields.items()
    }
    named = set(re.findall(r"`(\w+)[`:]", text)) | set(re.findall(r"^\s*#?\s*(\w+):", text, re.M))
    assert {(model, key) for model, key in keys if key not in named} == set()

    defaults: dict[str, set[str]] = {}
    for model in models:
        for name, field in model.model_fields.items():
            if field.default is not PydanticUndefined:
                defaults.setdefault(name, set()).add(_spelt(field.default))
    stated = re.findall(r"`(\w+)`[^`(]{0,30}\(default `([^`]+)`", text)
    assert len(stated) >= 4
    wrong = [(key, value) for key, value in stated if _spelt(value) not in defaults.get(key, set())]
    assert wrong == []


def _spelt(value: object) -> str:
    """A default as the docs write it: sizes in bytes, lists without quotes, strings bare."""
    if isinstance(value, str):
        text = value.strip('"')
        return str(parse_byte_size(text)) if re.fullmatch(r"\d+\s*[KMG]iB", text) else text
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
