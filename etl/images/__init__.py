"""Pure per-image work: encoded bytes -> decoded, checked, resized uint8 array (`stages`), and
the per-format decoders that prove every pixel came from the file (`formats`)."""
