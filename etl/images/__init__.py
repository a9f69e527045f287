"""Pure per-image work: encoded bytes -> decoded, checked, resized uint8 array, with
per-format decoders that prove every pixel came from the file.

Modules:
- `decode`:  the decode stage: bytes -> an upright RGB or L image
- `formats`: per-format decoders with the evidence that every pixel was read
- `recipe`:  the stages' plain copy of a validated config, as a worker gets it
- `rejects`: every reject reason, and which of them a file's bytes decide
- `stages`:  pure per-image stages: decode, validate, resize, call
"""
