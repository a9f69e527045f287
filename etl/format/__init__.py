"""The dataset folder's format: every rule about what lies on disk and how it is read back.

Shards (`shards`), the manifest and its version folders (`manifest`), commit records
(`record`), checksums (`checksums`), how a source's name is spelt (`names`) and the writer's
lock (`lock`). It imports nothing heavier than numpy and pyarrow, so a training node reads a
dataset without the ETL's dependencies. docs/FORMAT.md is its prose twin.
"""
