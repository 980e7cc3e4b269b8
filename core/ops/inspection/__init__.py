"""``mqstore inspect``: one store file decoded (``kinds`` tells what it is and picks the
decoder), as summary fields and a table of rows (``table.Inspection``)."""

from mqstore.ops.inspection.kinds import KINDS, detect_kind, inspect_path
from mqstore.ops.inspection.table import Inspection

__all__ = ["KINDS", "Inspection", "detect_kind", "inspect_path"]
