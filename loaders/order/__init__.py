"""Which sample when: sample orders as pure functions, the torch samplers over them, a
mixture's orders, aspect buckets, the world and resume arithmetic, and the history of a run
that lets any step's samples be drawn again.

Modules:
- `aspect_buckets`: aspect-ratio buckets: batches of one shape, uncropped
- `history`:        a run's history: the iterations a loader began, carried in its states
- `mixture_orders`: a mixture's orders, pure functions as `orders` are
- `mixture_trace`:  what a run's history keeps of a mixture to draw its orders again
- `orders`:         sample orders as pure functions of (data, seed, epoch)
- `quality`:        how well an order shuffles
- `resume`:         the state a training job saves, and its checks
- `run_batches`:    the batch sampler that carries a run's state: epoch, position, history
- `samplers`:       torch samplers over the pure orders: distributed, resumable
- `stream_orders`:  a stream's slots and windows, and its epoch shared with its workers
- `world`:          rank and world size
"""
