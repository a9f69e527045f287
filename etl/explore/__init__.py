"""Looking at data: a packed dataset as a table and pictures (`view`), a new config from a folder
(`scaffold`), and the bundled sample images (`sample_data`)."""
