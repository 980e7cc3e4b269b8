"""``mqstore produce DIR --topic T [BODY ...]``: append messages from the command line; with
``--server HOST:PORT`` through a served store's gRPC endpoint instead."""

from __future__ import annotations

import os
import re
import sys

import click

from mqstore.cli import output
from mqstore.cli.app import BadInput
from mqstore.cli.options import (
    config_option, json_option, load_cli_config, new_or_store_dir, server_options, short_lived,
)
from mqstore.cli.produce_input import InputError, Item, read_items
from mqstore.format.names import check_topic
from mqstore.format.properties import PROPERTY_UNIQ_KEY
from mqstore.message import MessageBatch, PutStatus
from mqstore.cli.uniq_keys import UniqKeys
from mqstore.store import MessageStore

BATCH = 1000  # messages per put_batch
PER_MESSAGE_MAX = 20  # above this many messages, a table shows a summary instead
AT_MESSAGE = re.compile(r"message (\d+): (.*)", re.S)  # how a batch names its bad message


def _properties(_ctx, _param, values: tuple[str, ...]) -> dict[str, str]:
    props = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE")
        props[name] = value
    return props


@click.command()
@click.argument("root", required=False, type=click.Path())
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
@click.option("--parse-key", default=None, metavar="SEP",
              help="Each line (and BODY) is KEYS<SEP>BODY: the message's KEYS tokens "
                   "(separated by spaces), then its body.")
@click.option("--json-lines", is_flag=True, default=False,
              help='Each line (and BODY) is a JSON object: {"body": ..., "tags": ..., '
                   '"keys": [...], "properties": {...}} (body_base64 for binary bodies).')
@click.option("--summary", is_flag=True, default=False,
              help="Print a summary instead of one row per message.")
@config_option
@server_options
@json_option
def produce(root: str | None, bodies: tuple[str, ...], topic: str, tags: str | None,
            keys: tuple[str, ...], properties: dict[str, str], queue_id: int | None,
            files: tuple[str, ...], lines: str | None, parse_key: str | None,
            json_lines: bool, summary: bool, config_path: str | None, server: str | None,
            access_key: str, secret_key: str, as_json: bool) -> None:
    """Append messages to the store in ROOT (created if missing or empty), or, with --server,
    send them to the store a `mqstore serve` serves (there is no ROOT then: every argument is
    a body).

    Bodies come from the BODIES arguments, --file and --lines; with none of them, each line
    of standard input is a body. A line's own keys and tags (--parse-key, --json-lines)
    replace --keys and --tags for its message; its properties are added to -p's. Every
    message gets a UNIQ_KEY, as RocketMQ's producers set one (unless it has one; through
    --server the client sets it). Prints each message's queue, queue offset, message id and
    UNIQ_KEY, or a summary for many (--json: every message), and how many were stored.

    A line that does not parse, or a message the store refuses, stops the command: the error
    names it and says how many messages were stored (every one before it).
    """
    if parse_key is not None and json_lines:
        raise click.UsageError("--parse-key and --json-lines are two ways of reading a line: "
                               "give one")
    if parse_key == "":
        raise click.BadParameter("the separator must not be empty", param_hint="'--parse-key'")
    if server is not None:
        if queue_id is not None or config_path is not None:
            raise click.UsageError("--queue and --config apply to a store directory; through "
                                   "--server the endpoint picks the queue")
        bodies = ((root,) if root is not None else ()) + bodies
    elif root is None:
        raise click.UsageError("give ROOT, a store directory, or --server HOST:PORT")
    else:
        root = new_or_store_dir(root)
    if not bodies and not files and lines is None:
        if sys.stdin.isatty():
            raise click.UsageError("no message: give BODIES, --file or --lines (or pipe lines "
                                   "into standard input)")
        lines = "-"
    check_topic(topic)  # the same for every message: refused as itself, before any is read
    total = len(bodies) + len(files) if lines is None else None
    items = iter(read_items(bodies, files, lines, parse_key, json_lines))
    if server is not None:
        _produce_via_server(server, topic, items, total, (tags, list(keys), properties),
                            access_key, secret_key, summary, as_json)
        return
    config = load_cli_config(config_path)
    with MessageStore.open(root, config=short_lived(config)) as store, \
            output.progress("producing", total, enabled=not as_json) as (advance, _total):
        producer = _Producer(store, topic, queue_id, (tags, list(keys) or None, properties))
        chunk: list[Item] = []
        while True:
            try:
                item = next(items, None)
            except InputError as exc:
                producer.put(chunk)  # every message before the bad line is stored
                raise BadInput(f"{exc}; {producer.stored()}") from None
            if item is not None:
                chunk.append(item)
            if len(chunk) == BATCH or (item is None and chunk):
                producer.put(chunk)
                advance(len(chunk))
                chunk = []
            if item is None:
                break
    _report(os.path.abspath(root), topic, producer.rows, producer.written, summary, as_json)


class _Producer:
    """Puts batches of items, with the command's options for what an item leaves out, and
    keeps what was stored."""

    def __init__(self, store: MessageStore, topic: str, queue_id: int | None,
                 defaults: tuple) -> None:
        self.store, self.topic, self.queue_id = store, topic, queue_id
        self.tags, self.keys, self.properties = defaults
        self.uniq_keys = UniqKeys()
        self.rows: list[dict] = []
        self.written = 0

    def put(self, chunk: list[Item]) -> None:
        """Store ``chunk``; a message the store refuses stops the command with its place in
        the input, after the messages before it are stored."""
        if not chunk:
            return
        batch = self._batch(chunk)
        try:
            result = self.store.put_batch(batch)
        except ValueError as exc:  # the whole batch was refused, nothing of it written
            found = AT_MESSAGE.fullmatch(str(exc))
            if found is None:
                raise BadInput(f"{exc}; {self.stored(chunk[0].where)}") from None
            bad = int(found[1])
            self.put(chunk[:bad])
            raise BadInput(f"{chunk[bad].where}: {found[2]}; {self.stored()}") from None
        if result.status is not PutStatus.PUT_OK:
            at = chunk[result.error_index].where if result.error_index is not None else None
            raise click.ClickException(
                f"put refused{' at ' + at if at else ''}: {result.status.name} "
                f"{result.error or ''}".rstrip() + f"; {self.stored(chunk[0].where)}")
        self.written += result.wrote_bytes
        self.rows += [{"queue_id": r.queue_id, "queue_offset": r.queue_offset,
                       "phys_offset": r.phys_offset, "size": r.size, "msg_id": r.msg_id,
                       "uniq_key": p.get(PROPERTY_UNIQ_KEY)}
                      for r, p in zip(result, batch.properties)]

    def _batch(self, chunk: list[Item]) -> MessageBatch:
        props = [{**self.properties, **(item.properties or {})} for item in chunk]
        for p, uniq in zip(props, self.uniq_keys.take(len(chunk))):
            p.setdefault(PROPERTY_UNIQ_KEY, uniq)  # one given is kept, as setUniqID keeps it
        return MessageBatch(
            topic=self.topic, bodies=[item.body for item in chunk], queue_ids=self.queue_id,
            tags=[item.tags if item.tags is not None else self.tags for item in chunk],
            keys=[item.keys if item.keys is not None else self.keys for item in chunk],
            properties=props)

    def stored(self, first_lost: str | None = None) -> str:
        """How many messages were stored when the command stopped (``first_lost``: the first
        of the input not stored, when it is not the one the error names)."""
        n = len(self.rows)
        if first_lost is not None:
            return (f"the first {n} message(s) were stored, none from {first_lost} on" if n
                    else "nothing was stored")
        return f"the {n} message(s) before it were stored" if n else "nothing was stored"


def _produce_via_server(server, topic, items, total, defaults, access_key, secret_key,
                        summary, as_json) -> None:
    from mqstore.endpoint import client
    try:
        client.check_server(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    with output.progress("producing", total, enabled=not as_json) as (advance, _total):
        try:
            rows = client.produce(server, topic, _messages(items, defaults),
                                  access_key=access_key, secret_key=secret_key,
                                  on_sent=lambda _row: advance(1))
        except InputError as exc:
            raise BadInput(str(exc)) from None
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


def _messages(items, defaults):
    """``(body, tags, keys, properties)`` of each item, the command's options filling in."""
    tags, keys, properties = defaults
    for item in items:
        yield (item.body, item.tags if item.tags is not None else tags,
               item.keys if item.keys is not None else keys,
               {**properties, **(item.properties or {})})


def _report(root: str, topic: str, rows: list[dict], written: int, summary: bool,
            as_json: bool) -> None:
    queues = sorted({r["queue_id"] for r in rows})
    if as_json:
        output.emit_json({"root": root, "topic": topic, "count": len(rows), "bytes": written,
                          "queues": queues, "messages": rows})
        return
    if rows and not summary and len(rows) <= PER_MESSAGE_MAX:
        output.print_table(("queue", "offset", "commit-log offset", "size", "msg id",
                            "uniq key"),
                           [(r["queue_id"], r["queue_offset"], r["phys_offset"], r["size"],
                             r["msg_id"], r["uniq_key"]) for r in rows],
                           whole=("msg id", "uniq key"))
    output.say(f"stored {len(rows)} message(s), {written} bytes, in {topic} queue(s) "
               f"{', '.join(map(str, queues)) or '-'}")
