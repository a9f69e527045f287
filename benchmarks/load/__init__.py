"""Loading: the loaders against the alternatives, with workers, crops, mixtures, stores and a
cold page cache.

Modules:
- `against_ffcv`: the loader against FFCV 1.0.2 (in its own venv) on the same samples
- `augment`:     batched augmentation and the CUDA feed, side by side
- `copies`:      memcpy and ways to gather a batch, against the loaders' gather
- `cold`:        reads from disk, against the device itself
- `ffcv_side`:   FFCV's half of `against_ffcv`, run by FFCV's venv (never imports ours)
- `from_store`:  training from object storage against local disk and the endpoint's limit
- `mixture`:     what a mixture costs and whether it keeps its weights
- `throughput`:  loader throughput against the alternatives, memory, shuffle quality
- `trace`:       what tracing a step of a long run costs
- `verify_rows`: what verify="rows" and verify="once" cost
- `workers`:     epochs with and without workers, two code trees side by side
"""
