"""The batch types every part of the loaders shares: what a loader yields, and a batch of
samples of several sizes back to back. The floor of the loaders: it imports none of them.

Modules:
- `forms`:  `PaddedBatch`, `BackToBackBatch`, `EncodedBatch`: how a batch of several sizes lies
- `ragged`: `RaggedImages`: a batch of ragged samples back to back in one flat tensor
- `types`:  `Batch`, `IndexedBatch`, `ColumnBatch`, and how a gathered batch becomes one
"""
