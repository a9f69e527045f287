"""What lies on disk: codecs, aspect-kept and encoded samples, columns, and a manifest's growth.

Modules:
- `aspect`:  aspect-kept storage against fixed-size storage of the same photos
- `codecs`:  bytes, encode and decode time, exactness of each codec
- `columns`: what per-sample columns cost the loaders
- `encoded`: samples stored encoded: bytes, pack rate, the loader's rate
- `scale`:   how opening and selecting a manifest grows with its rows
"""
