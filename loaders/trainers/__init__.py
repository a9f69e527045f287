"""Trainers that cannot take a loader as it is: small integrations, each imported only by who
uses it (the trainer library is theirs to install).

Modules:
- `hf`: transformers' `Trainer` over packed datasets, resumed exactly through its checkpoints
- `lightning`: a callback that logs the train loader's stats each epoch
"""
