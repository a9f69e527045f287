"""The dataset report: one self-contained HTML page per version, for a browser (`etl report`,
`etl run --report`). It stands above `etl.explore` (samples, thumbnails of rejects) and
`etl.maintenance` (the versions' history and diffs), which it shows together.

Modules:
- `charts`:   bar charts and histograms as SVG geometry, pure functions of counts
- `contents`: what the page shows, gathered from a version with bounded work (`gather`)
- `history`:  the versions' timeline and the pictures of the last version's changes
- `page`:     the HTML itself, a Jinja2 template with every value escaped (`write_report`)
- `thumbs`:   the pictures: JPEG data URIs of samples and rejects, or why there is none
"""
