"""How well an order shuffles, measured on what SGD sees: the class mix of each batch."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loaders.order.orders import random_order


def class_mix_distance(
    order: NDArray[np.integer], labels: NDArray[np.integer], batch_size: int
) -> float:
    """Mean total-variation distance between each full batch's class mix and the dataset's.

    `order` indexes `labels` (all of the dataset's labels, which define its class mix); it may
    be one rank's or one worker's part. 0 means every batch has exactly the dataset's class
    proportions; 1 means batches share no class with it. A uniformly random order is not 0
    either (sampling noise, about sqrt(classes / (2 pi batch_size)) for balanced classes):
    compare against `shuffle_quality`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    labels = np.asarray(labels)
    seen = labels[np.asarray(order)]
    batches = len(seen) // batch_size
    if batches == 0:
        return float("nan")
    n_classes = int(labels.max()) + 1
    overall = np.bincount(labels, minlength=n_classes) / len(labels)
    seen = seen[: batches * batch_size].reshape(batches, batch_size)
    offsets = np.arange(batches)[:, None] * n_classes
    counts = np.bincount((seen + offsets).reshape(-1), minlength=batches * n_classes)
    mix = counts.reshape(batches, n_classes) / batch_size
    return float(0.5 * np.abs(mix - overall).sum(axis=1).mean())


def shuffle_quality(
    order: NDArray[np.integer], labels: NDArray[np.integer], batch_size: int, seed: int = 0
) -> tuple[float, float]:
    """(class_mix_distance of `order`, the same for a random permutation of the same indices).

    A ratio near 1 means the order mixes classes into batches as well as a full shuffle.
    """
    order = np.asarray(order)
    shuffled = order[random_order(len(order), seed, 0)]
    return (
        class_mix_distance(order, labels, batch_size),
        class_mix_distance(shuffled, labels, batch_size),
    )
