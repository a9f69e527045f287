"""Starting a project: a first pipeline.yaml for a folder of images, and sample images.

Modules:
- `pictures`:    the picture of one sample image: its class's shape, light, blur and noise
- `sample_data`: the deterministic sample images (`etl sample-data`)
- `scaffold`:    `etl init`: write a commented pipeline.yaml for what a survey found
- `survey`:      `etl init`: what a folder holds, from its listing and a sample's headers
"""
