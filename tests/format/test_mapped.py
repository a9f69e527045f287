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


def test_opening_a_file_of_many_batches_leaves_its_pages_to_the_page_cache(tmp_path: Path) -> None:
    """Opening reads each batch's metadata, a page of every batch, and a recent kernel maps a
    whole folio per page touched: half of a 700 MB manifest was resident before any value was
    read. Opening lets go of them as it goes."""
    values = np.arange(8 << 20, dtype=np.int64)  # 64 MiB in 2,048 batches of 32 KiB
    path = tmp_path / "batches.arrow"
    table = pa.table({"v": values})
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 12)
    before = resident_file_kib()
    mapped = Mapped(path)
    assert resident_file_kib() - before < 8 << 10, "under 8 of 64 MiB resident after opening"
    assert (
        mapped.table.num_rows == len(values) and mapped.table.column("v")[-1].as_py() == values[-1]
    )
