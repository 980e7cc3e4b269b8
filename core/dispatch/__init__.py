"""Dispatch: commit-log records into consume queues, index files and plugins' derived files."""
