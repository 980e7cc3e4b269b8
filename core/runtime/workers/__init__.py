"""Worker processes: the dispatch loop in its own process, coordinated through shared memory."""
