"""The benchmarks: each a command (`python -m benchmarks.<room>.<name>`) that measures ratios
side by side in one run and prints a table for benchmarks/README.md.

Modules:
- `common`:   what the benchmarks share: the machine's name, peak memory, a loader's rate
- `formats/`: what lies on disk: codecs, aspect-kept and encoded samples, columns, scale
- `gpu/`:     what runs on a GPU machine (gpu_check.sh runs it all)
- `load/`:    the loaders against the alternatives
- `maintain/`: audits and reports
- `pack/`:    packing against the plain alternatives
- `photos`:   the photos every benchmark packs: crops of scikit-image's photographs
- `run`:      every benchmark of the README, one after another (`make bench`)
"""
