"""Host memory this process already has, page-locked for CUDA in place (`cudaHostRegister`).

NOTE [ a ring pinned in place ]: batches from DataLoader workers arrive in slots of a shared-
memory ring (`loaders.memory.ring`). Registered with CUDA once, those slots are pinned memory: the
DataLoader's pin thread finds the images already pinned and copies nothing, and a
non-blocking copy to the GPU reads the slot directly. What registering costs and gives is
measured by `benchmarks/load/workers.py` with CUDA (benchmarks/README.md).

Two things can make it fail, and then the loader keeps today's path (the pin thread copies each
batch into pinned memory) and says why once: CUDA refusing the range (a limit on locked memory,
the range registered already), and a driver that marks the range not to be inherited on fork
(`MADV_DONTFORK`, seen with RDMA stacks): workers forked after it would find no ring.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
import warnings
from pathlib import Path

import torch

PORTABLE = 1
"""`cudaHostRegisterPortable`: pinned for every CUDA context, whichever device copies."""

MADV_DOFORK = 11
"""Linux `madvise` advice that undoes `MADV_DONTFORK`."""


class Registration:
    """A range of host memory page-locked with CUDA until `close` (or until it is collected).

    `seconds`: what `cudaHostRegister` took (benchmarks report it for the ring's size).
    """

    def __init__(self, memory: torch.Tensor, seconds: float) -> None:
        self.memory = memory  # kept alive (mapped) while registered
        self.address = memory.data_ptr()
        self.nbytes = memory.untyped_storage().nbytes()
        self.seconds = seconds
        self.process = os.getpid()
        self.closed = False

    def close(self) -> None:
        """Unregister (once). Called when the ring is collected; errors are ignored: at
        interpreter exit CUDA may be unloading, and the process's mappings go with it anyway."""
        if self.closed or os.getpid() != self.process:  # a forked worker's copy: not its own
            return
        self.closed = True
        try:
            torch.cuda.cudart().cudaHostUnregister(self.address)
        except Exception:
            pass
        finally:
            self.memory = torch.empty(0, dtype=torch.uint8)


def register(memory: torch.Tensor) -> Registration | str:
    """Page-lock `memory` (a CPU tensor's whole storage) in place, or say why it was not."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    nbytes = memory.untyped_storage().nbytes()
    start = time.perf_counter()
    try:
        error = int(torch.cuda.cudart().cudaHostRegister(memory.data_ptr(), nbytes, PORTABLE))
    except (AttributeError, RuntimeError) as exc:
        return f"cudaHostRegister is not available here ({exc})"
    if error != 0:
        _clear_last_cuda_error()
        return f"cudaHostRegister of {nbytes >> 20} MiB failed with CUDA error {error}"
    registration = Registration(memory, time.perf_counter() - start)
    if not _inherited_on_fork(registration):
        registration.close()
        return "the driver keeps page-locked memory from forked workers (MADV_DONTFORK)"
    return registration


def _inherited_on_fork(registration: Registration) -> bool:
    """Whether forked workers still see the range (no `dc` flag in its smaps entry), after
    undoing a `MADV_DONTFORK` the driver may have set: the ring is shared memory, which a
    fork shares rather than copies, so the pages stay where the GPU reads them."""
    if sys.platform != "linux" or _dont_fork(registration) is not True:
        return True
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise(
        ctypes.c_void_p(registration.address), ctypes.c_size_t(registration.nbytes), MADV_DOFORK
    )
    return _dont_fork(registration) is False


def _dont_fork(registration: Registration) -> bool | None:
    """The `dc` (do not copy on fork) flag of the mapping holding the range; None if unknown."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and head.replace("-", "").isalnum() and ":" not in head:
            low, high = (int(side, 16) for side in head.split("-"))
            inside = low <= registration.address < high
        elif inside and line.startswith("VmFlags:"):
            return "dc" in line.split()[1:]
    return None


def _clear_last_cuda_error() -> None:
    """Reset CUDA's last error after a failed `cudaHostRegister`: the runtime keeps it, and
    torch's next kernel-launch check would report it as that kernel's error. torch's cudart
    binding has no cudaGetLastError, so call the runtime library this process loaded."""
    try:
        maps = Path("/proc/self/maps").read_text().split()
    except OSError:
        return
    for path in dict.fromkeys(word for word in maps if "libcudart.so" in word):
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except OSError:
            continue
        return
    warnings.warn(
        "could not reset CUDA's last error after a failed cudaHostRegister",
        RuntimeWarning,
        stacklevel=3,
    )
