"""Pure byte layouts: bytes <-> values. No files, clocks or threads live here."""
