"""The inputs: listing every source kind (`listing`, `containers`) and reading a listed source's
bytes by its locator (`readers`), in the parent and in the workers alike."""
