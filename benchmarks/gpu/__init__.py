"""What runs on a GPU machine (`benchmarks/gpu_check.sh` runs them all; `aspect.sh` and
`pack.sh` run one part).

Modules:
- `device_decode`:  which library decodes a batch's JPEGs on the device
- `encoded_epochs`: JPEG samples read onto the GPU four ways (`formats.encoded --gpu`)
"""
