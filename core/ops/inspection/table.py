"""What ``mqstore inspect`` shows of one file: summary fields and a table of rows."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Inspection:
    path: str
    kind: str
    fields: dict = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    next_at: int | None = None  # where ``--at`` continues when ``--limit`` cut the rows

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "fields": self.fields,
                "rows": self.rows, "next_at": self.next_at}
