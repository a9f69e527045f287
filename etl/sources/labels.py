"""How a record's label becomes a class name: text as it is, an integer as an index into the
declared class names or as its own digits."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any


def label_text(value: Any) -> str | None:
    """A label as a class name: text as it is (stripped; empty is None), an integer (also a
    numpy one) as its decimal digits."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"label {value!r} is a {type(value).__name__}, not text or an integer")


def class_name_of(value: Any, classes: tuple[str, ...] | None) -> str | None:
    """A record's label as a class name. Text is a class name as it is (stripped; empty is
    None). An integer (also a numpy one) indexes `classes` when given, and otherwise stands for
    itself as its decimal digits. ValueError for a negative integer (the Hub's -1: no label) or
    one outside `classes`, TypeError for a value that is neither."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"label {int(value)} is negative: the record has no class")
        if classes is not None:
            if int(value) >= len(classes):
                raise ValueError(f"label {int(value)} is outside the {len(classes)} class names")
            return classes[int(value)]
    return label_text(value)


def integer_classes(names: Iterable[str]) -> tuple[str, ...] | None:
    """For labels that are all non-negative integers: '0' .. the largest, so label i stays i
    even where a class has no sample; None when any label is not such an integer."""
    largest = -1
    for name in names:
        if not name.isdecimal() or (len(name) > 1 and name[0] == "0"):
            return None
        largest = max(largest, int(name))
    return tuple(str(i) for i in range(largest + 1)) if largest >= 0 else None
