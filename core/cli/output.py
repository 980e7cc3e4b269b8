"""How commands print: rich tables and progress bars on a terminal, JSON for scripts.

Progress bars go to stderr and only when it is a terminal, so piped output and ``--json`` stay
machine-readable. Errors are raised as click exceptions (``app.MqstoreGroup``), never printed
here. A lookup that found nothing is no error: ``nothing_matched`` says so on stderr and exits
1, as grep does.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterator, NoReturn, Sequence

import click
from rich.console import Console
from rich.progress import (
    BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

_out: Console | None = None
_err: Console | None = None
NOTHING_MATCHED = 1  # the exit status of a lookup that found nothing (grep's)


def out() -> Console:
    global _out
    if _out is None:
        # Wide enough that a table piped to a file or a pager is not squeezed to 80 columns.
        probe = Console()
        _out = probe if probe.is_terminal else Console(width=160, highlight=False)
    return _out


def err() -> Console:
    global _err
    if _err is None:
        _err = Console(stderr=True)
    return _err


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None,
                ) -> None:
    table = Table(title=title, title_justify="left", show_lines=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    out().print(table)


def print_fields(fields: dict[str, Any], title: str | None = None) -> None:
    """A two-column table of names and values."""
    print_table(("field", "value"), [(k, v) for k, v in fields.items()], title)


def nothing_matched(what: str) -> NoReturn:
    """End a command whose lookup found nothing: ``what`` on stderr, exit 1."""
    err().print(what, markup=False, highlight=False, soft_wrap=True)
    raise click.exceptions.Exit(NOTHING_MATCHED)


def say(text: str) -> None:
    out().print(text, markup=False, highlight=False)


@contextlib.contextmanager
def progress(description: str, total: int | None, *, in_bytes: bool = False,
             enabled: bool = True) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """``(advance(n), set_total(n))`` for a bar on stderr; both do nothing when stderr is not
    a terminal or ``enabled`` is false."""
    console = err()
    show = enabled and console.is_terminal
    columns = [TextColumn("{task.description}"), BarColumn(),
               DownloadColumn() if in_bytes else MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, disable=not show, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield (lambda n: bar.advance(task, n)), (lambda n: bar.update(task, total=n))
