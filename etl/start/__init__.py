"""Starting a project: `scaffold` writes a first pipeline.yaml for a folder of images (`etl
init`), `sample_data` writes the deterministic sample images (`etl sample-data`)."""
