"""``mqstore produce DIR --topic T [BODY ...]``: append messages from the command line."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator

import click

from mqstore.cli import output
from mqstore.cli.options import (
    config_option, json_option, load_cli_config, new_or_store_dir, short_lived,
)
from mqstore.message import MessageBatch, PutStatus
from mqstore.store import MessageStore

BATCH = 1000  # messages per put_batch
PER_MESSAGE_MAX = 20  # above this many messages, a table shows a summary instead


def _properties(_ctx, _param, values: tuple[str, ...]) -> dict[str, str]:
    props = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE")
        props[name] = value
    return props


def _bodies(bodies: tuple[str, ...], files: tuple[str, ...], lines: str | None) -> Iterator[bytes]:
    for body in bodies:
        yield body.encode("utf-8")
    for path in files:
        with open(path, "rb") as f:
            yield f.read()
    if lines is not None:
        with click.open_file(lines, "rb") as f:
            for line in f:
                yield line.rstrip(b"\r\n")


def _chunks(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@click.command()
@click.argument("root", type=click.Path(),
                callback=lambda _ctx, _param, root: new_or_store_dir(root))
@click.argument("bodies", nargs=-1)
@click.option("-t", "--topic", required=True, help="Topic of every message.")
@click.option("--tags", default=None, help="TAGS of every message.")
@click.option("--keys", "keys", multiple=True,
              help="A KEYS token of every message (repeat for several).")
@click.option("-p", "--property", "properties", multiple=True, callback=_properties,
              metavar="NAME=VALUE", help="A user property of every message (repeatable).")
@click.option("-q", "--queue", "queue_id", type=click.IntRange(0), default=None,
              help="Queue id (default: the configured queue selector chooses).")
@click.option("-f", "--file", "files", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="A file whose content is one message body (repeatable).")
@click.option("-l", "--lines", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="A file whose every line is a message body; '-' reads standard input.")
@click.option("--summary", is_flag=True, default=False,
              help="Print a summary instead of one row per message.")
@config_option
@json_option
def produce(root: str, bodies: tuple[str, ...], topic: str, tags: str | None,
            keys: tuple[str, ...], properties: dict[str, str], queue_id: int | None,
            files: tuple[str, ...], lines: str | None, summary: bool, config_path: str | None,
            as_json: bool) -> None:
    """Append messages to the store in ROOT (created if missing or empty).

    Bodies come from the BODIES arguments, --file and --lines; with none of them, each line
    of standard input is a body. Prints each message's queue, queue offset and message id, or
    a summary for many (--json: every message).
    """
    if not bodies and not files and lines is None:
        if sys.stdin.isatty():
            raise click.UsageError("no message: give BODIES, --file or --lines (or pipe lines "
                                   "into standard input)")
        lines = "-"
    config = load_cli_config(config_path)
    total = len(bodies) + len(files) if lines is None else None
    rows: list[dict] = []
    written = 0
    with MessageStore.open(root, config=short_lived(config)) as store, \
            output.progress("producing", total, enabled=not as_json) as (advance, _total):
        for chunk in _chunks(_bodies(bodies, files, lines), BATCH):
            result = store.put_batch(MessageBatch(
                topic=topic, bodies=chunk, queue_ids=queue_id, tags=tags,
                keys=[list(keys)] * len(chunk) if keys else None,
                properties=properties or None))
            if result.status is not PutStatus.PUT_OK:
                raise click.ClickException(
                    f"put refused after {len(rows)} message(s) were stored: "
                    f"{result.status.name} {result.error or ''}".rstrip())
            written += result.wrote_bytes
            rows += [{"queue_id": r.queue_id, "queue_offset": r.queue_offset,
                      "phys_offset": r.phys_offset, "size": r.size, "msg_id": r.msg_id}
                     for r in result]
            advance(len(chunk))
    _report(os.path.abspath(root), topic, rows, written, summary, as_json)


def _report(root: str, topic: str, rows: list[dict], written: int, summary: bool,
            as_json: bool) -> None:
    queues = sorted({r["queue_id"] for r in rows})
    if as_json:
        output.emit_json({"root": root, "topic": topic, "count": len(rows), "bytes": written,
                          "queues": queues, "messages": rows})
        return
    if rows and not summary and len(rows) <= PER_MESSAGE_MAX:
        output.print_table(("queue", "offset", "commit-log offset", "size", "msg id"),
                           [(r["queue_id"], r["queue_offset"], r["phys_offset"], r["size"],
                             r["msg_id"]) for r in rows], whole=("msg id",))
    output.say(f"{len(rows)} message(s), {written} bytes to {topic} queue(s) "
               f"{', '.join(map(str, queues)) or '-'}")
