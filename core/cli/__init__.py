"""The ``mqstore`` command line: one module per command, on click and rich.

The work behind each command lives in ``mqstore.ops`` (and the store itself); these modules
only parse options and print.
"""

from mqstore.cli.app import main
from mqstore.cli.demo import DEMO_MARKER

__all__ = ["main", "DEMO_MARKER"]
