"""``mqstore check DIR [--fix]``: verify every record and cross-check queues and the index."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, existing_root, json_option, load_cli_config
from mqstore.ops.checking.checker import CheckReport, check_store
from mqstore.ops.checking.repair import repair


@click.command()
@existing_root
@config_option
@click.option("--fix", is_flag=True, default=False,
              help="Repair what can be repaired (the store's own recovery and rebuild), say "
                   "what was done, and check again.")
@json_option
@click.pass_context
def check(ctx: click.Context, root: str, config_path: str | None, fix: bool,
          as_json: bool) -> None:
    """Verify every commit-log record (CRC, size chain, position) and cross-check the
    consume queues and the key index against the commit log, read-only.

    Each problem is reported with its file and offset. Exit status: 0 when the store is
    clean (after --fix: once repaired), 1 when problems are found (remain).

    --fix needs the store closed: it rebuilds damaged consume queues and the index from the
    commit log, and opens the store, whose recovery quarantines damaged records (keeping a
    copy under quarantine/), cuts a torn tail and clears a stale abort marker. The -c
    configuration sets the sizes of files it creates (index files, consume queues).
    """
    config = load_cli_config(config_path)
    found = _run(root, config, as_json)
    if not fix or found.clean:
        _show(found, as_json)
        ctx.exit(0 if found.clean else 1)
    actions = repair(root, config, found.problems)
    after = _run(root, config, as_json)
    if as_json:
        output.emit_json({"found": found.to_dict(), "actions": actions,
                          "after": after.to_dict(), "clean": after.clean})
    else:
        _show(found, False)
        output.print_table(("repair",), [(a,) for a in actions], title="what --fix did")
        _show(after, False, title="after --fix")
    ctx.exit(0 if after.clean else 1)


def _run(root: str, config, quiet: bool) -> CheckReport:
    with output.progress("checking", None, in_bytes=True, enabled=not quiet) as (advance, total):
        return check_store(root, config, on_total=total, advance=advance)


def _show(report: CheckReport, as_json: bool, title: str | None = None) -> None:
    if as_json:
        output.emit_json(report.to_dict())
        return
    index = "index checked" if report.index_checked else "index not checked (disabled)"
    output.say(f"{title + ': ' if title else ''}{report.records} records, "
               f"{report.commit_log_bytes} bytes, CRC bad {report.crc_bad}, "
               f"{report.queues} consume queues, {index}: "
               + ("clean" if report.clean else f"{len(report.problems)} problem(s)"))
    if report.problems:
        output.print_table(("kind", "file", "offset", "problem"),
                           [(p.kind, p.file, p.offset, p.detail) for p in report.problems],
                           whole=("file",))
    for note in report.notes:
        output.say(f"note: {note}")
