"""The loader's threads (`loaders.read.threads`): a batch's crops made on a pool of threads in
the training process are the crops one thread makes, in order, whichever thread made which;
the pool really does the work; a failure is raised once every sample is done; and inside a
DataLoader worker there is no pool."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import loaders.augment.worker_crop as worker_crop
from loaders import PackedDataset, RandomResizedCrop, make_loader
from loaders.read.threads import run_each, sample_threads
from tests.helpers.codecs import pack_photos
from tests.helpers.random_dataset import write_random_dataset

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_photos(tmp_path_factory.mktemp("photos"), "jpeg", count=12)


def _epoch(root: Path, threads: int) -> list[np.ndarray]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ds = PackedDataset.open(root).with_crop(RandomResizedCrop(16, seed=3))
        loader = make_loader(ds, batch_size=5, shuffle=True, seed=1)
        return [batch.images.numpy().copy() for batch in loader]
    finally:
        torch.set_num_threads(before)


def test_crops_on_threads_are_those_of_one_thread(
    jpeg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch's batches on 2 threads equal one thread's, batch for batch (a crop is a pure
    function of seed, epoch and index), and the pool's threads cut some of the samples (the
    thread that spreads them cuts one share itself)."""
    one = _epoch(jpeg, 1)
    workers: set[str] = set()
    cut = worker_crop.crop_sample

    def noted(*args: object) -> None:
        workers.add(threading.current_thread().name)
        cut(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_crop, "crop_sample", noted)
    two = _epoch(jpeg, 2)
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(name.startswith("loaders-sample") for name in workers), workers


def test_a_failure_is_raised_after_every_call_finished() -> None:
    """The first failure in call order is raised, and only once the others are done: nothing
    still writes into the batch when the caller sees the error."""
    done = np.zeros(6, bool)
    started = threading.Barrier(2, timeout=10) if sample_threads() > 1 else None

    def call(i: int) -> None:
        if i == 1:
            raise ValueError("sample 1")
        if i == 4:
            raise KeyError("sample 4")
        if started is not None and i in (0, 2):
            started.wait()  # two calls at once: the pool's threads run them
        done[i] = True

    with pytest.raises(ValueError, match="sample 1"):
        run_each([lambda i=i: call(i) for i in range(6)])
    assert done[[0, 2, 3, 5]].all()


def test_no_pool_inside_a_dataloader_worker(jpeg: Path) -> None:
    """Workers are the parallelism there: each reports one thread."""
    ds = PackedDataset.open(jpeg).with_crop(RandomResizedCrop(16, seed=3))

    class Threads(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> int:
            return sample_threads()

    seen = list(torch.utils.data.DataLoader(Threads(), batch_size=None, num_workers=2))
    assert seen == [1, 1]
    assert len(list(make_loader(ds, batch_size=6, num_workers=2, workers_as="processes"))) == 2


@pytest.mark.parametrize("verify", ["once", False])
def test_a_large_batch_is_copied_by_the_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: str | bool
) -> None:
    """A 3 MiB batch of random rows is copied (and checked, the first time) by the pool's
    threads, and equals what np.load finds at each row (the shards read plainly)."""
    import loaders.read.span as span

    if sample_threads() < 2:
        pytest.skip("one thread here: nothing to spread")
    paths = write_random_dataset(tmp_path, 600, (64, 64, 3), per_shard=200)
    names: list[str] = []
    take = span.ShardSpan.take

    def noted(self: span.ShardSpan, rows: np.ndarray, out: np.ndarray) -> None:
        names.append(threading.current_thread().name)
        take(self, rows, out)

    monkeypatch.setattr(span.ShardSpan, "take", noted)
    ds = PackedDataset.open(tmp_path, verify=verify)  # type: ignore[arg-type]
    order = np.random.default_rng(0).permutation(600)[:256]
    batch = ds.gather(order)
    plain = np.concatenate([np.load(p) for p in paths])
    np.testing.assert_array_equal(batch.images.numpy(), plain[order])
    assert len(names) >= 2 and any(n.startswith("loaders-sample") for n in names), names


def test_work_handed_on_from_a_pool_thread_runs_there() -> None:
    """A call on the pool that spreads work of its own (a reader's copy inside a crop's call)
    runs it in place instead of waiting for a thread that is itself."""
    done: list[int] = []

    def outer(i: int) -> None:
        run_each([lambda j=j: done.append(10 * i + j) for j in range(3)])

    run_each([lambda i=i: outer(i) for i in range(4)])
    assert sorted(done) == sorted(10 * i + j for i in range(4) for j in range(3))
