"""`where=` as SQL: one boolean expression over the manifest's columns, never a query.

NOTE [ a predicate, never a query ]: a condition may come from a shared view file, so it is
parsed before it runs, by duckdb's own parser (`json_serialize_sql`), and its tree checked:
one SELECT of the row numbers from the manifest with this WHERE and nothing else (no set
operation, no subquery, no ORDER, LIMIT or CTE), whose expression is built only from the
manifest's columns, constants, comparisons, AND/OR/NOT, IN, BETWEEN, CASE, CAST and the
deterministic scalar functions of `FUNCTIONS`. So `true) UNION ALL SELECT 999999999 --` is
refused in one line naming the file, before anything runs. It then runs sealed (no file, no
network, no extension), within `MEMORY`, on `THREADS` threads, for at most `SECONDS`; and the
row numbers it returns are checked to be rows of the manifest, each once.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from etl.errors import SelectionError

MEMORY = "1GB"
THREADS = 2
SECONDS = 60.0
ROW = "__row"

NODES = frozenset(
    {
        *("COLUMN_REF", "CONSTANT", "COMPARISON", "CONJUNCTION", "OPERATOR", "BETWEEN"),
        *("CASE", "CAST", "TYPE"),
    }
)
"""Expression nodes a predicate may hold, besides FUNCTION (of `FUNCTIONS` only); TYPE is
a CAST's target type (duckdb 2 parses it as an expression)."""
FUNCTIONS = frozenset(
    {
        # LIKE, ILIKE, GLOB and arithmetic, as the parser names them
        *("~~", "!~~", "~~*", "!~~*", "~~~", "+", "-", "*", "/", "//", "%", "||"),
        # strings
        *("lower", "upper", "length", "strlen", "len", "starts_with", "ends_with", "prefix"),
        *("suffix", "contains", "regexp_matches", "regexp_full_match", "substr", "substring"),
        *("trim", "ltrim", "rtrim", "concat", "replace", "split_part", "left", "right"),
        # numbers
        *("abs", "round", "floor", "ceil", "ceiling", "sign", "sqrt", "ln", "log", "log2"),
        *("log10", "exp", "pow", "power", "mod", "greatest", "least", "isnan", "isinf"),
        *("isfinite", "hash", "md5", "coalesce", "ifnull", "nullif"),
        # lists
        *("array_length", "list_contains", "list_has", "array_contains", "list_has_any"),
        *("list_has_all", "list_extract", "list_element", "array_extract", "list_min"),
        *("list_max", "list_sum", "list_avg", "list_count", "list_unique"),
    }
)
"""Deterministic scalar functions a predicate may call: none reads a file, the clock, a
setting or a random draw, so a view selects the same rows wherever it is opened."""


def sql_mask(table: pa.Table, condition: str, where: Path) -> NDArray[np.bool_]:
    """The rows of `table` for which the SQL `condition` holds (NOTE [ a predicate, never a
    query ]); a condition that is not one, or that duckdb refuses, is a SelectionError naming
    `where` and quoting it."""
    try:
        import duckdb
    except ImportError:
        raise SelectionError(
            "where= as SQL needs duckdb: pip install duckdb (or pass a pyarrow Expression)"
        ) from None
    query = f"SELECT {ROW} FROM samples WHERE ({condition})"
    sealed: dict[str, str | bool | int | float | list[str]] = {
        "enable_external_access": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "memory_limit": MEMORY,
        "threads": THREADS,
    }
    with duckdb.connect(config=sealed) as connection:
        tree = connection.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0]
        names = {name.lower() for name in table.column_names}  # as SQL matches them
        problem = _refusal(json.loads(tree[0]) if tree else {}, names)
        if problem:
            raise SelectionError(f"{where}: where={condition!r} is not a condition: {problem}")
        numbered = table.append_column(ROW, pa.array(np.arange(table.num_rows)))
        connection.register("samples", numbered)
        timer = threading.Timer(SECONDS, connection.interrupt)
        timer.start()
        try:
            kept = np.asarray(connection.execute(query).fetchnumpy()[ROW], dtype=np.int64)
        except duckdb.InterruptException:
            raise SelectionError(
                f"{where}: where={condition!r} took longer than {SECONDS:g} s"
            ) from None
        except duckdb.Error as exc:
            first = " ".join(str(exc).split())
            raise SelectionError(f"{where}: where={condition!r}: {first}") from None
        finally:
            timer.cancel()
    if kept.size and (kept.min() < 0 or kept.max() >= table.num_rows):
        raise SelectionError(f"{where}: where={condition!r} selected rows the manifest lacks")
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[kept] = True
    if int(mask.sum()) != kept.size:
        raise SelectionError(f"{where}: where={condition!r} selected a row twice")
    return mask


def _refusal(parsed: Any, columns: set[str]) -> str | None:
    """Why the parse of the query is not one SELECT of the rows where a predicate holds, or
    None if it is."""
    if parsed.get("error"):
        return " ".join(str(parsed.get("error_message", "unreadable")).split())
    statements = parsed.get("statements") or []
    if len(statements) != 1:
        return "more than one statement"
    node = statements[0].get("node") or {}
    if node.get("type") != "SELECT_NODE":
        return f"it makes the query a {str(node.get('type', '?')).lower().replace('_', ' ')}"
    plain = (
        not node.get("modifiers")
        and not (node.get("cte_map") or {}).get("map")
        and [c.get("column_names") for c in node.get("select_list") or []] == [[ROW]]
        and (node.get("from_table") or {}).get("type") == "BASE_TABLE"
        and (node.get("from_table") or {}).get("table_name") == "samples"
        and not node.get("group_expressions")
        and not node.get("having")
        and not node.get("qualify")
    )
    if not plain:
        return "it adds to the query (ORDER, LIMIT, GROUP, a CTE)"
    return _expression_refusal(node.get("where_clause"), columns)


def _expression_refusal(expression: Any, columns: set[str]) -> str | None:
    """The first part of `expression` a predicate may not hold, described; None if none."""
    stack = [expression]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("class")
        if kind is not None:
            if kind == "FUNCTION":
                name = str(item.get("function_name", ""))
                if name.lower() not in FUNCTIONS or item.get("schema"):
                    return f"the function {name}() is not one a predicate may call"
            elif kind == "COLUMN_REF":
                names = [str(name).lower() for name in item.get("column_names") or []]
                if names[:1] == ["samples"] and len(names) > 1:
                    names = names[1:]  # samples.score: the table's name, then the column
                if not names or names[0] not in columns:  # then maybe a struct's fields
                    return f"no column {'.'.join(names)} in the manifest"
            elif kind not in NODES:
                return f"{str(kind).lower().replace('_', ' ')} is not allowed in a predicate"
        stack.extend(value for value in item.values() if isinstance(value, (dict, list)))
    return None
