"""Keeping a dataset sound: proving it, repairing it, compacting it, reading its history.

Modules:
- `audit/`:        prove that every stored byte is what the manifest says
- `checkup`:       `etl audit --repair`: audit, repair, audit again, one report
- `housekeeping`:  compaction: what no version needs is removed
- `repack`:        a repair worker's shard: verified rows copied, bad samples decoded again
- `repair`:        re-pack what an audit found damaged, as a new version
- `store_compact`: `etl compact` of a dataset in a store
- `store_repair`:  a repair of a dataset in a store, published as a run's version
- `versions`:      a dataset's history: what each version holds, how two differ
"""
