"""Looking at data: a packed dataset as a table and pictures (`view`, `drawing`), and the
rejected files of a run (`reject_sheet`)."""
