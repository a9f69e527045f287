"""The datasets a loader reads: the map-style `PackedDataset`, the streamed `PackedStream`, and
`Mixture`, several of them read as one by weight.

Modules:
- `joined_reader`: one reader over a `Mixture`'s members' shards
- `member_reads`:  a `Mixture`'s batch read member by member, and its members' checks
- `mixture`:       `Mixture`: datasets or views read as one by weight
- `opening`:       how `PackedDataset.open` opens a selection, and the record of it
- `packed`:        `PackedDataset`: the map-style dataset
- `stream`:        `PackedStream`: whole shards streamed, for data larger than RAM
"""
