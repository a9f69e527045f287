"""Crops, flips and resizes: their random parameters drawn as pure functions of (seed, epoch,
index), applied as batched tensor ops on the device, or made where batches are gathered.

Modules:
- `crops`:       batched crops, flips and resizes on the device
- `draws`:       crop boxes and flips, pure functions of (seed, epoch, index)
- `worker_crop`: crops made where batches are gathered, decoded at a reduced scale
"""
