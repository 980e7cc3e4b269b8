"""Files on disk: open, append, read, truncate, flush. Decisions about *when* live elsewhere."""
