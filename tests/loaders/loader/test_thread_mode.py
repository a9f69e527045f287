"""The loader's thread mode (NOTE [ batches read ahead on a thread ] in
`loaders.loader.iteration`, NOTE [ num_workers out of habit ] in `loaders.loader.workers`):
`num_workers=N` on our batches runs in the training process, the next batches read ahead on a
thread; the batches are those the shards hold at the order's indices (np.load of the shards,
not our reader), the same whatever the read-ahead, held ones never overwritten; a pass left
early leaves no thread reading, and resumes exactly; processes come where the work needs them.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from loaders import PackedDataset, make_loader
from loaders.loader.iteration import AHEAD_THREAD
from tests.helpers.random_dataset import write_random_dataset

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A dataset of 90 random 8x8x3 samples in 3 shards, and every sample as np.load reads it."""
    root = tmp_path_factory.mktemp("packed")
    paths = write_random_dataset(root, 90, (8, 8, 3), per_shard=30)
    return root, np.concatenate([np.load(p) for p in paths])


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(AHEAD_THREAD)]


def test_num_workers_out_of_habit_runs_on_threads(packed: tuple[Path, np.ndarray]) -> None:
    """`num_workers=2` on our batches: no worker process ever starts, the batches are read
    ahead on the loader's thread, and each holds the shards' samples at its indices."""
    root, plain = packed
    loader = make_loader(
        PackedDataset.open(root), batch_size=8, shuffle=True, num_workers=2, with_indices=True
    )
    assert (loader.num_workers, loader.ahead) == (0, 2)
    me, seen, readers = psutil.Process(), [], set()
    before = set(me.children())  # a resource tracker, say
    for batch in loader:
        assert set(me.children()) <= before
        readers.update(t.name for t in _readers())
        np.testing.assert_array_equal(batch.images.numpy(), plain[batch.indices.numpy()])
        seen.extend(batch.indices.tolist())
    assert sorted(seen) == list(range(90)) and seen != sorted(seen)
    assert readers, "no thread read ahead"


def test_the_read_ahead_changes_no_batch(packed: tuple[Path, np.ndarray]) -> None:
    """Batches with 0, 1 and 3 read ahead, and from worker processes, are the same batches in
    the same order."""
    root, _ = packed

    def epoch(**options: object) -> list[np.ndarray]:
        ds = PackedDataset.open(root)
        loader = make_loader(ds, batch_size=7, shuffle=True, seed=4, **options)  # type: ignore[arg-type]
        loader.set_epoch(2)
        return [b.images.numpy().copy() for b in loader]

    reference = epoch(prefetch_factor=0)
    for options in ({"prefetch_factor": 1}, {"prefetch_factor": 3},
                    {"num_workers": 2, "workers_as": "processes"}):  # fmt: skip
        got = epoch(**options)
        assert len(got) == len(reference) == 13
        for a, b in zip(reference, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_held_batches_are_never_overwritten(packed: tuple[Path, np.ndarray]) -> None:
    """A loop that keeps the last 4 batches while the next ones are read ahead into reused
    buffers: every kept batch still holds its own samples."""
    root, plain = packed
    loader = make_loader(PackedDataset.open(root), batch_size=6, shuffle=True, with_indices=True)
    kept: list[object] = []
    for batch in loader:
        kept = [*kept[-3:], batch]
        for old in kept:
            np.testing.assert_array_equal(old.images.numpy(), plain[old.indices.numpy()])  # type: ignore[attr-defined]


def test_a_pass_left_early_stops_reading_and_resumes_exactly(
    packed: tuple[Path, np.ndarray],
) -> None:
    """A `break` after 4 batches: the reading thread is gone when the loop has left, and a
    fresh loader resumed from the state yields exactly the samples not yet delivered."""
    root, _ = packed
    loader = make_loader(PackedDataset.open(root), batch_size=8, shuffle=True, with_indices=True)
    delivered = []
    for i, batch in enumerate(loader):
        delivered.extend(batch.indices.tolist())
        if i == 3:
            break
    assert not _readers()
    state = loader.state_dict()
    again = make_loader(PackedDataset.open(root), batch_size=8, shuffle=True, with_indices=True)
    again.load_state_dict(state)
    rest = [i for batch in again for i in batch.indices.tolist()]
    assert len(delivered) == 32 and sorted(delivered + rest) == list(range(90))


def test_processes_where_the_work_needs_them(packed: tuple[Path, np.ndarray]) -> None:
    """A per-sample transform of the user's, a collate_fn, a worker_init_fn or a context keep
    worker processes, persistent unless told; `workers_as` decides either way; anything else
    in `workers_as` is refused."""
    root, plain = packed
    flip = PackedDataset.open(root, transform=lambda image: image.flip(0))
    by_transform = make_loader(flip, batch_size=30, num_workers=2)
    assert (by_transform.num_workers, by_transform.persistent_workers) == (2, True)
    first = next(iter(by_transform)).images.numpy()
    np.testing.assert_array_equal(first, plain[:30, ::-1])
    told = make_loader(PackedDataset.open(root), num_workers=2, persistent_workers=False,
                       worker_init_fn=lambda _: None)  # fmt: skip
    assert (told.num_workers, told.persistent_workers) == (2, False)
    collated = make_loader(PackedDataset.open(root), num_workers=2, collate_fn=list)
    assert collated.num_workers == 2
    forced = make_loader(flip, batch_size=30, num_workers=2, workers_as="threads")
    assert forced.num_workers == 0
    np.testing.assert_array_equal(next(iter(forced)).images.numpy(), plain[:30, ::-1])
    with pytest.raises(ValueError, match="workers_as must be 'threads' or 'processes'"):
        make_loader(PackedDataset.open(root), num_workers=2, workers_as="fibers")


def test_samples_decoded_here_go_to_persistent_processes(tmp_path: Path) -> None:
    """JPEG samples (decoded as batches are made, where the crops' Python holds the GIL):
    `num_workers=2` starts persistent worker processes, and their batches are the crops one
    thread makes in the training process."""
    from loaders import RandomResizedCrop
    from tests.helpers.codecs import pack_photos

    root = pack_photos(tmp_path, "jpeg", count=8)
    ds = PackedDataset.open(root).with_crop(RandomResizedCrop(16, seed=2))
    habit = make_loader(ds, batch_size=4, num_workers=2)
    assert (habit.num_workers, habit.persistent_workers, habit.ahead) == (2, True, 0)
    here = make_loader(ds, batch_size=4)
    for a, b in zip(habit, here, strict=True):
        np.testing.assert_array_equal(a.images.numpy(), b.images.numpy())


def test_a_bad_row_is_raised_at_its_batch(tmp_path: Path) -> None:
    """A row whose bytes changed on disk, read ahead: the batches before its own are handed
    out, then its batch raises the error naming the shard, and no thread is left reading."""
    paths = write_random_dataset(tmp_path, 40, (8, 8, 3), per_shard=20)
    with open(paths[1], "r+b") as f:  # row 5 of the second shard: sample 25
        f.seek(-15 * 8 * 8 * 3, 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    loader = make_loader(PackedDataset.open(tmp_path, verify="rows"), batch_size=10)
    handed = 0
    with pytest.raises(Exception, match=r"v000001-00001\.npy") as caught:
        for _ in loader:
            handed += 1
    assert handed == 2 and "Traceback" not in str(caught.value)
    assert not _readers()
