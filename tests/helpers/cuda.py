"""What the CUDA tests share (tests/loaders/device/test_cuda*.py)."""

from __future__ import annotations

from typing import Any

import torch


def batches_without_a_sync(device: Any) -> int:
    """Batches of epoch 1 of a `DeviceLoader` (after a warm-up epoch that fills the allocators
    and loads the kernels), any host sync that torch sees an error."""
    for _ in device:
        pass
    device.set_epoch(1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return sum(1 for _ in device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
