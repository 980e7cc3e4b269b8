"""``mqstore produce DIR --topic T [BODY ...]``: append messages from the command line; with
``--server HOST:PORT`` through a served store's gRPC endpoint instead."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator

import click

from mqstore.cli import output
from mqstore.cli.options import (
    config_option, json_option, load_cli_config, server_options, short_lived,
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
@click.argument("root", required=False, type=click.Path(file_okay=False))
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
@server_options
@json_option
def produce(root: str | None, bodies: tuple[str, ...], topic: str, tags: str | None,
            keys: tuple[str, ...], properties: dict[str, str], queue_id: int | None,
            files: tuple[str, ...], lines: str | None, summary: bool, config_path: str | None,
            server: str | None, access_key: str, secret_key: str, as_json: bool) -> None:
    """Append messages to the store in ROOT (created if missing), or, with --server, send
    them to the store a `mqstore serve` serves (there is no ROOT then: every argument is a
    body).

    Bodies come from the BODIES arguments, --file and --lines; with none of them, each line
    of standard input is a body. Prints each message's queue, queue offset and message id, or
    a summary for many (--json: every message). Through --server the endpoint picks the
    queue; the message id is the client's (its UNIQ_KEY).
    """
    if server is not None:
        if queue_id is not None or config_path is not None:
            raise click.UsageError("--queue and --config apply to a store directory; through "
                                   "--server the endpoint picks the queue")
        bodies = ((root,) if root is not None else ()) + bodies
    elif root is None:
        raise click.UsageError("give ROOT, a store directory, or --server HOST:PORT")
    if not bodies and not files and lines is None:
        if sys.stdin.isatty():
            raise click.UsageError("no message: give BODIES, --file or --lines (or pipe lines "
                                   "into standard input)")
        lines = "-"
    total = len(bodies) + len(files) if lines is None else None
    if server is not None:
        _produce_via_server(server, topic, _bodies(bodies, files, lines), total, tags, keys,
                            properties, access_key, secret_key, summary, as_json)
        return
    config = load_cli_config(config_path)
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


def _produce_via_server(server, topic, bodies, total, tags, keys, properties, access_key,
                        secret_key, summary, as_json) -> None:
    from mqstore.endpoint import client
    try:
        client.check_server(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    with output.progress("producing", total, enabled=not as_json) as (advance, _total):
        try:
            rows = client.produce(server, topic, bodies, tags=tags, keys=keys,
                                  properties=properties, access_key=access_key,
                                  secret_key=secret_key, on_sent=lambda _row: advance(1))
        except ImportError as exc:
            raise click.ClickException(f"--server needs the grpc extra ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - the client's refusals carry RocketMQ's code
            raise click.ClickException(f"{server}: send failed: {exc}") from None
    written = sum(r["size"] for r in rows)
    if as_json:
        output.emit_json({"server": server, "topic": topic, "count": len(rows),
                          "bytes": written, "messages": rows})
        return
    if rows and not summary and len(rows) <= PER_MESSAGE_MAX:
        output.print_table(("offset", "size", "msg id"),
                           [(r["queue_offset"], r["size"], r["msg_id"]) for r in rows])
    output.say(f"{len(rows)} message(s), {written} body bytes sent to {topic} at {server}")


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
                             r["msg_id"]) for r in rows])
    output.say(f"{len(rows)} message(s), {written} bytes to {topic} queue(s) "
               f"{', '.join(map(str, queues)) or '-'}")
