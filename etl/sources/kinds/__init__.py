"""One module (or package) per source kind, each ending in its `KIND` (`etl.sources.kind`):
how it lists, how a worker reads one input, how an input is found again. The registry
(`etl.sources.registry`) holds them; nothing else knows their names."""
