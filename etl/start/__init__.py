"""Starting a project: a first pipeline.yaml for a folder of images, and sample images.

Modules:
- `sample_data`: the deterministic sample images (`etl sample-data`)
- `scaffold`:    `etl init`: survey a folder and write a commented pipeline.yaml
"""
