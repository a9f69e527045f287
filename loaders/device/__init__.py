"""Batches onto the device: `DeviceLoader`'s non-blocking copies on a side stream, and samples
stored encoded decoded where the batch goes.

Modules:
- `decode`: samples stored encoded, decoded where the batch goes (nvJPEG on CUDA)
- `loader`: `DeviceLoader`: batches onto the device, prefetched on a side stream
"""
