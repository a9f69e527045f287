"""The DataLoader: `PackedLoader`, the builders with this project's defaults, the shuffles by
name, its workers, and the queries that rebuild a run's loader from a saved state.

Modules:
- `factories`:    `make_loader` and `stream_loader` with this project's defaults
- `gathering`:    how a loader's batches are made: the collate, the memory, the form
- `iteration`:    a pass's parts that are not DataLoader's: batches read ahead, counting
- `named_orders`: sample orders by name (`shuffle=`), and how a loader batches
- `packed`:       `PackedLoader`: the DataLoader, with exact and elastic resume
- `readers`:      trainers whose handling of a batch would change what it means (Keras)
- `states`:       a loader's state: its identity, and where its run stands
- `stats`:        where a pass's time went: the loop's waits and steps, the slowest stage
- `trace`:        which samples a run read at a step, from its saved states
- `workers`:      threads or processes for `num_workers`; workers' errors, and stopping them
"""
