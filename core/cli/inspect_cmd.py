"""``mqstore inspect PATH``: decode one store file into a readable table."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, json_option, load_cli_config
from mqstore.ops.inspection.kinds import KINDS, inspect_path


@click.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--kind", type=click.Choice(KINDS), default=None,
              help="What the file is (default: told by its name and place in the store).")
@click.option("--at", type=click.IntRange(0), default=None,
              help="Where to start: a commit-log offset (segments), a queue offset "
                   "(consume-queue files) or an entry number (index files).")
@click.option("-n", "--limit", type=click.IntRange(1), default=100, show_default=True,
              help="Rows to show at most.")
@config_option
@json_option
def inspect(path: str, kind: str | None, at: int | None, limit: int, config_path: str | None,
            as_json: bool) -> None:
    """Decode PATH: a commit-log segment (records, sizes, CRC ok/bad, tags, keys), a
    consume-queue file (units, each checked against its record), an index file (header and
    entries), the checkpoint, the abort marker, or a JSON file (consumer offsets,
    mqstore.json, the queue manifest, the clean-shutdown marker). mqstore and RocketMQ
    stores alike.

    The -c configuration gives the slot and entry counts of index files whose size does not
    tell them.
    """
    index = load_cli_config(config_path).index if config_path else None
    counts = (index.max_hash_slots, index.max_index_entries) if index else None
    result = inspect_path(path, kind, at, limit, counts)
    if as_json:
        output.emit_json(result.to_dict())
        return
    output.print_fields({"kind": result.kind, **result.fields}, title=path)
    if result.columns:
        output.print_table(result.columns, [
            [" ".join(v) if isinstance(v, list) else v for v in (row.get(c) for c in
                                                                  result.columns)]
            for row in result.rows], whole=("msg_id",))
    if result.next_at is not None:
        output.say(f"more rows: --at {result.next_at}")
