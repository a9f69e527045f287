"""What runs work, shared by the run and the maintenance jobs: `parallel` (joblib, the only
user; worker counts), `cluster` (Dask, the only user), `fill` (the one way a shard is filled)
and `interrupt` (Ctrl-C and SIGTERM for the CLI and its workers)."""
