"""`python -m etl` is the same as the `etl` command."""

from etl.cli import main

main()
