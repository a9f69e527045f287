from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from etl.config import PipelineConfig, load_config, parse_byte_size
from etl.errors import ConfigError

GOOD = """\
source:
  kind: folder
  path: data
stages:
  - decode: {mode: RGB}
  - resize:
      size: [32, 48]
      mode: pad
output:
  dir: out
  shard_size: 1MiB
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def test_good_config_resolves_paths_and_derives_shapes(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.source.path == (tmp_path / "data").resolve()
    assert config.output.dir == (tmp_path / "out").resolve()
    assert config.sample_shape == (32, 48, 3)
    assert config.samples_per_shard == (1 << 20) // (32 * 48 * 3)
    assert config.resize.mode == "pad"


def test_tiny_images_still_make_bounded_shards(tmp_path: Path) -> None:
    """8x8 grey images would fit 4M samples in the default 256 MiB, one task whose results
    reach the parent in one piece: shards sized by bytes hold at most 65,536 samples; an
    explicit samples_per_shard is taken as given."""
    tiny = GOOD.replace("size: [32, 48]", "size: [8, 8]").replace("mode: RGB", "mode: L")
    assert (
        load_config(write(tmp_path, tiny.replace("  shard_size: 1MiB\n", ""))).samples_per_shard
        == 65_536
    )
    assert load_config(write(tmp_path, tiny)).samples_per_shard == 16_384
    explicit = tiny.replace("shard_size: 1MiB", "samples_per_shard: 100000")
    assert load_config(write(tmp_path, explicit)).samples_per_shard == 100_000


def test_chw_and_grey_shape(tmp_path: Path) -> None:
    text = GOOD.replace("mode: RGB", "mode: L").replace("dir: out", "dir: out\n  layout: CHW")
    config = load_config(write(tmp_path, text))
    assert config.sample_shape == (1, 32, 48)


@pytest.mark.parametrize(
    ("needle", "replacement", "expected"),
    [
        (
            "mode: pad",
            "mode: pad\n      colour: [1, 2, 3]",
            ":9: stages[1].resize.colour: unknown key",
        ),
        (
            "size: [32, 48]",
            "size: [32, -1]",
            ":7: stages[1].resize.size[1]: Input should be greater than 0",
        ),
        ("mode: pad", "mode: squash", ":8: stages[1].resize.mode:"),
        ("shard_size: 1MiB", "shard_size: lots", ":11: output.shard_size:"),
        ("kind: folder", "kind: folder\n  colour: red", ":3: source.colour: unknown key"),
        ("  - decode: {mode: RGB}\n", "", "the first stage must be 'decode'"),
        ("  - decode: {mode: RGB}\n", "  - decode: {}\n  - blur: {radius: 2}\n", "stages[1]"),
    ],
)
def test_bad_configs_name_key_and_line(
    tmp_path: Path, needle: str, replacement: str, expected: str
) -> None:
    assert needle in GOOD
    path = write(tmp_path, GOOD.replace(needle, replacement))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert expected in message
    assert "\n" not in message


def test_unknown_stage_lists_the_valid_ones(tmp_path: Path) -> None:
    path = write(
        tmp_path, GOOD.replace("  - decode: {mode: RGB}\n", "  - decode: {}\n  - blur: {}\n")
    )
    with pytest.raises(ConfigError, match="decode, resize, validate, call"):
        load_config(path)


def test_yaml_aliases_are_refused(tmp_path: Path) -> None:
    bomb = GOOD + "extra: &a [1, 2]\nmore: *a\n"
    with pytest.raises(ConfigError, match="aliases"):
        load_config(write(tmp_path, bomb))


def test_yaml_object_construction_is_refused(tmp_path: Path) -> None:
    evil = GOOD + "x: !!python/object/apply:os.system ['echo hacked']\n"
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, evil))


def test_syntax_error_names_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pipeline.yaml:4: invalid YAML: expected"):
        load_config(write(tmp_path, "source:\n  kind: folder\n  path: [unclosed\n"))


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, ""))


def test_run_overrides_and_output_shaping(tmp_path: Path) -> None:
    base = load_config(write(tmp_path, GOOD))
    fast = load_config(write(tmp_path, GOOD), n_jobs=2, backend="threading")
    assert fast.run.n_jobs == 2 and fast.run.backend == "threading"
    assert fast.digest() == base.digest(), "run settings must not change the output digest"
    bigger = load_config(write(tmp_path, GOOD.replace("[32, 48]", "[32, 64]")))
    assert bigger.digest() != base.digest()


def test_split_fractions_are_checked(tmp_path: Path) -> None:
    text = GOOD.replace("path: data", "path: data\n  split: {val: 0.7, test: 0.6}")
    with pytest.raises(ConfigError, match="add up to"):
        load_config(write(tmp_path, text))


def test_shard_size_and_samples_per_shard_exclusive(tmp_path: Path) -> None:
    text = GOOD.replace("shard_size: 1MiB", "shard_size: 1MiB\n  samples_per_shard: 10")
    with pytest.raises(ConfigError, match="not both"):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("256MiB", 256 << 20), ("64MB", 64_000_000), ("1.5KiB", 1536), (4096, 4096), ("12", 12)],
)
def test_parse_byte_size(text: object, expected: int) -> None:
    assert parse_byte_size(text) == expected


def test_checked_in_pipeline_yaml_is_valid() -> None:
    config = load_config(Path(__file__).parents[2] / "pipeline.yaml")
    assert isinstance(config, PipelineConfig)
    assert config.source.kind == "folder"


# --- configs with traps, the way a user meets them: `etl run`, one line, exit 2, nothing made


def run_etl(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("  path: data\n", "  path: data\n  kind: listing\n"),
            r"pipeline\.yaml:4: key 'kind' appears twice in one mapping \(lines 2 and 4\)",
        ),
        (
            GOOD.replace("  dir: out\n", "  dir: out\n  shard_size: 2MiB\n"),
            r"pipeline\.yaml:12: key 'shard_size' appears twice .*lines 11 and 12",
        ),
        (
            "source: !!python/object/apply:os.system [echo hi]\n",
            r"pipeline\.yaml:1: invalid YAML: could not determine a constructor .*tags are not",
        ),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", r"pipeline\.yaml:1: nested deeper than 64"),
        ("a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n", r"pipeline\.yaml:1: nested deeper"),
        (GOOD.replace("path: data", "path: nowhere"), r"source\.path: .*nowhere is not a folder"),
    ],
)
def test_config_traps_are_one_line_exit_2_and_create_nothing(
    tmp_path: Path, text: str, expected: str
) -> None:
    done = run_etl(write(tmp_path, text))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "pipeline.yaml"]
