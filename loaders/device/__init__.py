"""Batches onto the device: `DeviceLoader`'s non-blocking copies on a side stream, and samples
stored encoded decoded where the batch goes.

Modules:
- `checks`: what `DeviceLoader` takes: batches checked before a copy, their channels
- `decode`: samples stored encoded, decoded where the batch goes (nvJPEG on CUDA)
- `loader`: `DeviceLoader`: batches onto the device, prefetched on a side stream
"""
