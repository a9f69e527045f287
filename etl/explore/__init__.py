"""Looking at data: a packed dataset as a table and pictures, and the rejected files of a run.

Modules:
- `dataset`:      `open_dataset`: a version as a table, images, summaries and sheets
- `drawing`:      contact sheets and class-balance charts with Pillow alone
- `reject_sheet`: thumbnails of rejected sources, read back as a run reads them
- `summary`:      a version in numbers: what `etl inspect` shows and `--json` writes
"""
