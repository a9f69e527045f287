"""Keeping a dataset sound: `audit` proves it, `repair` re-packs what an audit found bad,
`housekeeping` removes what no version needs, `versions` reads its history."""
