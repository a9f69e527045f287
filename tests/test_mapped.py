"""`etl.format.mapped.Mapped`: a mapped Arrow file whose pages the process can let go of
without losing a byte (checked against the values written, with plain pyarrow)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from etl.format.mapped import Mapped


def resident_file_kib() -> int:
    """This process's resident pages of mapped files, in KiB (RssShmem where the temporary
    folder is a tmpfs)."""
    status = Path("/proc/self/status").read_text()
    return sum(int(kib) for kib in re.findall(r"Rss(?:File|Shmem):\s+(\d+)", status))


def test_released_pages_leave_the_process_and_read_back_the_same(tmp_path: Path) -> None:
    values = np.random.default_rng(0).integers(0, 1 << 62, 8 << 20, dtype=np.int64)  # 64 MiB
    path = tmp_path / "big.arrow"
    table = pa.table({"v": values})
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    mapped = Mapped(path)
    before = resident_file_kib()
    mapped.table.column("v").to_numpy().sum()  # reads every page
    touched = resident_file_kib()
    mapped.release()
    released = resident_file_kib()
    assert touched - before > 48 << 10, "reading 64 MiB through the map is resident"
    assert touched - released > 48 << 10, "release let go of the pages read"
    np.testing.assert_array_equal(mapped.table.column("v").to_numpy(), values)
    again = pickle.loads(pickle.dumps(mapped))
    assert again.path == path and again.table.equals(table)
