"""How commands print: rich tables and progress bars on a terminal, JSON for scripts.

Progress bars go to stderr and only when it is a terminal, so piped output and ``--json`` stay
machine-readable. Errors are raised as click exceptions (``app.MqstoreGroup``), never printed
here. A lookup that found nothing is no error: ``nothing_matched`` says so on stderr and exits
1, as grep does.

Table columns holding identifiers (message ids, paths) are never wrapped: a table too wide for
the terminal is printed at the width they need, and the terminal's lines run long instead.
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
from rich.text import Text

_out: Console | None = None
_err: Console | None = None
NOTHING_MATCHED = 1  # the exit status of a lookup that found nothing (grep's)
FOLD_FLOOR = 20  # a column that folds keeps its longest word whole up to this width


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
                whole: Sequence[str] = ()) -> None:
    """A table; the columns named in ``whole`` (ids, paths) are never wrapped or cut, the
    others fold long values."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    table = Table(title=Text(title, no_wrap=True, overflow="ignore") if title else None,
                  title_justify="left", show_lines=False)
    needed = 1  # the left border; each column adds its padding and right border
    for i, name in enumerate(columns):
        if name in whole:
            width = max([len(name), *(len(line) for row in cells
                                      for line in row[i].splitlines())])
            table.add_column(name, width=width, no_wrap=True, overflow="ignore")
        else:  # headers never fold; words fold only past FOLD_FLOOR
            width = max([len(name), *(min(len(word), FOLD_FLOOR) for row in cells
                                      for word in row[i].split())])
            table.add_column(name, min_width=width, overflow="fold")
        needed += width + 3
    for row in cells:
        table.add_row(*row)
    console = out()
    if needed > console.width:  # print's own width is capped at the console's
        console = Console(file=console.file, width=needed, color_system=console.color_system,
                          force_terminal=console.is_terminal, highlight=False)
    console.print(table, crop=False)


def print_fields(fields: dict[str, Any], title: str | None = None) -> None:
    """A two-column table of names and values (never wrapped: paths, ids)."""
    print_table(("field", "value"), [(k, v) for k, v in fields.items()], title,
                whole=("field", "value"))


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
