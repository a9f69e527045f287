"""The report's histograms of a column's values, whatever the values: the widest floats
(+-1.7e308, whose range overflows), the widest integers, one value repeated; every value is
counted once and the axis names the extremes in a few characters."""

from __future__ import annotations

import numpy as np
import pytest

from etl.report.charts import histogram


@pytest.mark.parametrize(
    "values",
    [
        np.array([-1.7e308, 1.7e308, 0.0, 1.0, np.inf, np.nan]),
        np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max], np.int64),
        np.array([5.0, 5.0, 5.0]),
        np.linspace(-3, 3, 1000),
    ],
)
def test_a_histogram_counts_every_finite_value_once(values: np.ndarray) -> None:
    drawn = histogram(values)
    assert drawn is not None
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    counted = sum(int(bar[4].rsplit(": ", 1)[1].replace(",", "")) for bar in drawn.bars)
    assert counted == finite.size
    assert len(drawn.low) <= 12 and len(drawn.high) <= 12
