"""Reading: pulls, lookups by offset, id, key and time, and their fast paths."""
