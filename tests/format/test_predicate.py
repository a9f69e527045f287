"""`where=` as SQL is one boolean expression over the manifest's columns, never a query: what
a shared view file may hold is parsed and checked before it runs, runs within limits, and the
rows it selects are the rows plain numpy selects from the same columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.errors import SelectionError
from etl.format import predicate

pytest.importorskip("duckdb")

WHERE = Path("views/shared.yaml")


@pytest.fixture
def table() -> pa.Table:
    rng = np.random.default_rng(4)
    n = 500
    return pa.table(
        {
            "source": [f"{'cat' if i % 3 else 'dog'}/{i:04d}.jpg" for i in range(n)],
            "label": rng.integers(0, 5, n),
            "score": rng.random(n),
            "split": np.where(rng.random(n) < 0.2, "val", "train"),
            "boxes": [list(range(i % 4)) for i in range(n)],
            "meta": [{"origin": "cam1" if i % 2 else "cam2"} for i in range(n)],
        }
    )


def test_a_predicate_selects_what_numpy_selects(table: pa.Table) -> None:
    label = table.column("label").to_numpy()
    score = table.column("score").to_numpy()
    split = np.asarray(table.column("split").to_pylist())
    source = table.column("source").to_pylist()
    boxes = [len(b) for b in table.column("boxes").to_pylist()]
    origin = [m["origin"] for m in table.column("meta").to_pylist()]
    cases = {
        "label IN (1, 3) AND score >= 0.5": np.isin(label, [1, 3]) & (score >= 0.5),
        "split = 'val' OR NOT (score < 0.9)": (split == "val") | ~(score < 0.9),
        "lower(source) LIKE 'dog/%' AND len(boxes) > 1": np.array(
            [s.startswith("dog/") and b > 1 for s, b in zip(source, boxes, strict=True)]
        ),
        "meta.origin = 'cam1' AND score BETWEEN 0.2 AND 0.4": np.array(
            [o == "cam1" for o in origin]
        )
        & (score >= 0.2)
        & (score <= 0.4),
        "CASE WHEN label = 0 THEN score > 0.1 ELSE false END": (label == 0) & (score > 0.1),
        "samples.label % 2 = 0": label % 2 == 0,
        "CAST(label AS INTEGER) % 2 = 1 AND CAST(label AS DECIMAL(4, 0)) > 2": (label % 2 == 1)
        & (label > 2),
    }
    for condition, expected in cases.items():
        got = predicate.sql_mask(table, condition, WHERE)
        np.testing.assert_array_equal(got, expected, err_msg=condition)


@pytest.mark.parametrize(
    ("condition", "why"),
    [
        ("true) UNION ALL SELECT 999999999 --", "set operation"),
        ("true) UNION ALL SELECT -1 --", "set operation"),
        ("1 = 1); DROP TABLE samples; --", "is not a condition"),
        ("label IN (SELECT label FROM samples LIMIT 1)", "subquery"),
        ("(SELECT count(*) FROM read_csv('/etc/passwd')) > 0", "subquery"),
        ("random() < 0.5", "random()"),
        ("getenv('HOME') = ''", "getenv()"),
        ("current_setting('threads') = '1'", "current_setting()"),
        ("row_number() OVER () < 10", "window"),
        ("__row < 10", "no column __row"),
        ("nope > 1", "no column nope"),
        ("true) ORDER BY (score", "adds to the query"),
        ("true) LIMIT (1", "adds to the query"),
        ("main.lower(source) = ''", "lower()"),
    ],
)
def test_anything_but_a_predicate_is_refused_in_one_line_naming_the_file(
    table: pa.Table, condition: str, why: str
) -> None:
    with pytest.raises(SelectionError) as raised:
        predicate.sql_mask(table, condition, WHERE)
    message = str(raised.value)
    assert message.startswith(f"{WHERE}: where=") and "\n" not in message, message
    assert why in message, message


def test_a_predicate_that_runs_too_long_is_stopped_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 2_000_000
    big = pa.table({"source": pa.array([f"{i:09d}-aaaaaaaaaaaaaaaaaaaaaaaa" for i in range(n)])})
    monkeypatch.setattr(predicate, "SECONDS", 0.05)
    with pytest.raises(SelectionError, match=r"took longer than 0\.05 s"):
        predicate.sql_mask(big, "regexp_matches(source, '(a|aa)*b') OR length(source) < 0", WHERE)
