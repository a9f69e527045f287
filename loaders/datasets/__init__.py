"""The datasets a loader reads: the map-style `PackedDataset`, the streamed `PackedStream`, and
`Mixture`, several of them read as one by weight.

Modules:
- `joined_reader`: one reader over a `Mixture`'s members' shards
- `mixture`:       `Mixture`: datasets or views read as one by weight
- `opening`:       how `PackedDataset.open` was called: a run's record, former keywords
- `packed`:        `PackedDataset`: the map-style dataset
- `stream`:        `PackedStream`: whole shards streamed, for data larger than RAM
"""
