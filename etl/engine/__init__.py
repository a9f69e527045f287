"""What runs work, shared by the run and the maintenance jobs.

Modules:
- `cluster`:   Dask: connect or start a cluster, check its workers; the only Dask user
- `fill`:      the one way a shard is filled, for a run and a repair alike
- `interrupt`: Ctrl-C and SIGTERM: one exception, no commit after it
- `parallel`:  `parallel_map` over a run's backend; the only joblib user
"""
