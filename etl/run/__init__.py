"""A run: config -> list -> hash -> plan -> pack -> commit. `pipeline` is the only
orchestrator; `plan` decides; `execute` runs workers over `etl.engine`.

Modules:
- `decide`:       each checked file's fate, pure and columnar
- `execute`:      the two parallel phases: hashing files, packing shards
- `hash_buckets`: rows dealt out by content hash to files on disk
- `phases`:       the phases of a run (list, hash and plan, pack, commit), each timed
- `pipeline`:     the only orchestrator: the phases in order, under the lock
- `plan`:         pure planning: pack, keep or reject each input
- `report`:       `RunReport`: what a run reports
- `results`:      a worker's columns joined back to the plan's rows
- `staged`:       the plan of any listing, a window and a bucket at a time, on disk
- `tasks`:        what a worker gets: a batch of one shard's sources
- `worker`:       what a worker runs: hashing files, packing a task, from plain data
- `to_store`:     an output in a store: pack in a work folder, then publish
"""
