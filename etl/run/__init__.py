"""A run: config -> list -> hash -> plan -> pack -> commit. `pipeline` is the only orchestrator;
`plan` decides, `execute` runs workers (joblib, or Dask through `cluster`), `interrupt` stops
cleanly on a signal."""
