"""Where a batch lives: pageable buffers reused in one process, the shared-memory ring workers
fill, and host memory page-locked for CUDA in place; `batch_memory` chooses among them for
where the batch goes next.

Modules:
- `batch_memory`: where a batch is gathered: pageable, pinned, or a ring slot
- `buffer_pool`:  pageable buffers lent to one batch at a time, reused between batches
- `pinning`:      host memory page-locked for CUDA in place
- `ring`:         the shared-memory ring workers fill, freed after its copies
"""
