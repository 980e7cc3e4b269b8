"""Appending: validating, encoding and writing messages into the commit log."""
