"""``mqstore consume DIR --topic T --group G``: read a topic as a consumer group; with
``--server HOST:PORT`` through a served store's gRPC endpoint (a RocketMQ 5 SimpleConsumer)."""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Sequence

import click

from mqstore.cli import output
from mqstore.cli.options import (
    config_option, epoch_ms, load_cli_config, server_options, store_dir,
)
from mqstore.ops.consume import ConsumeRequest, consume as consume_messages, stop_on_signals
from mqstore.format.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from mqstore.ops.messages import message_dict, shown
from mqstore.store import MessageStore

COLUMNS = ("queue", "offset", "msg id", "uniq key", "tags", "keys", "properties", "body")
SERVER_COLUMNS = ("msg id", "attempt", "tags", "keys", "properties", "body")
IN_COLUMNS = (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)  # properties with a column
FORMATS = ("value", "json", "table")


def _start(_ctx, _param, value: str) -> tuple[str, int | None]:
    """``--from``: (consume_from, consume_timestamp) for ``store.consumer``."""
    if value in ("first", "last"):
        return value, None
    try:
        ms = epoch_ms(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not first, last, epoch milliseconds or an "
                                 f"ISO-8601 time (e.g. 2024-05-01T12:00:00)") from None
    if ms < 0:
        raise click.BadParameter(f"{value!r} is before 1970-01-01, the first store time")
    return "timestamp", ms


@click.command()
@click.argument("root", required=False, type=click.Path())
@click.option("-t", "--topic", required=True, help="Topic to consume.")
@click.option("-g", "--group", required=True,
              help="Consumer group: offsets are committed per group and queue, and instances "
                   "of a group (in any processes) share the topic's queues.")
@click.option("-e", "--expression", default=None,
              help="TAG subscription: 'TagA || TagB', '*' (default: every message).")
@click.option("--sql", default=None,
              help="SQL92 subscription on message properties: \"region = 'eu' AND n > 3\".")
@click.option("--from", "start", default="last", show_default=True, callback=_start,
              metavar="first|last|TIME",
              help="Where a group with no committed offsets starts: its first stored message, "
                   "only messages put from now on, or the first stored at or after TIME "
                   "(epoch ms or ISO-8601). A group with offsets resumes after its last "
                   "commit.")
@click.option("-n", "--max", "limit", type=click.IntRange(1), default=None, metavar="N",
              help="Stop after N messages (exactly those N are committed).")
@click.option("-f", "--follow", is_flag=True, default=False,
              help="Wait for new messages (long polling) until Ctrl-C or SIGTERM, like "
                   "tail -f; without it, stop once caught up.")
@click.option("--no-commit", is_flag=True, default=False,
              help="Peek: print what the group would get next, from its committed offsets "
                   "(--from where it has none), without joining it or writing anything; its "
                   "running instances keep their queues.")
@config_option
@server_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="value: each body as it is stored, a line each; json: one JSON object per "
                   "message, a line each, every field; table: for people, bodies and "
                   "properties in full. Default: table on a terminal, value when piped.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Same as --format json.")
@click.pass_context
def consume(ctx: click.Context, root: str | None, topic: str, group: str,
            expression: str | None, sql: str | None, start: tuple[str, int | None],
            limit: int | None, follow: bool, no_commit: bool, config_path: str | None,
            server: str | None, access_key: str, secret_key: str, fmt: str | None,
            as_json: bool) -> None:
    """Read a topic of the store in ROOT as a consumer group, printing each message, and
    commit the group's offsets as far as was printed (its next run goes on from there).

    Opens the store read-only, so it runs beside a writer (mqstore serve, produce). A topic
    the store does not have is refused with exit status 1 (--follow waits for it instead).
    Ctrl-C or SIGTERM stops it after the messages being printed, committed; exit status 0.

    With --server (no ROOT), receives through the gRPC endpoint of a running `mqstore serve`
    as RocketMQ 5's SimpleConsumer does, acknowledging each message once printed; a group new
    to a queue starts where RocketMQ 5 starts it (docs/endpoint.md), so --from and
    --no-commit do not apply.
    """
    if expression is not None and sql is not None:
        raise click.UsageError("--expression and --sql are mutually exclusive: a group "
                               "consumer has one subscription")
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} say different things")
    fmt = "json" if as_json else fmt or ("table" if sys.stdout.isatty() else "value")
    if server is not None:
        explicit = ctx.get_parameter_source("start") is not click.core.ParameterSource.DEFAULT
        if root is not None or no_commit or explicit or config_path is not None:
            raise click.UsageError("ROOT, --from, --no-commit and --config apply to a store "
                                   "directory, not to --server")
        _consume_via_server(server, topic, group, sql if sql is not None else expression,
                            sql is not None, limit, follow, access_key, secret_key, fmt)
        return
    if root is None:
        raise click.UsageError("give ROOT, a store directory, or --server HOST:PORT")
    root = store_dir(root)
    consume_from, consume_timestamp = start
    request = ConsumeRequest(
        group=group, topic=topic, expression=sql if sql is not None else expression,
        expression_type="SQL92" if sql is not None else "TAG", consume_from=consume_from,
        consume_timestamp=consume_timestamp, limit=limit, follow=follow, commit=not no_commit)
    config = load_cli_config(config_path)
    with MessageStore.open(root, config=config, read_only=True) as store:
        if topic not in store.topics():
            if not follow:  # before the group writes anything
                output.nothing_matched(f"topic {topic!r} does not exist in this store")
            output.err().print(f"topic {topic!r} does not exist yet: waiting for its first "
                               f"message", markup=False, highlight=False, soft_wrap=True)
        with stop_on_signals() as stop:
            count = consume_messages(store, request, PRINTERS[fmt], stop)
    if fmt != "json":
        done = "not committed (--no-commit)" if no_commit else "committed"
        output.err().print(f"{count} message(s) consumed by group {group!r}; {done}",
                           markup=False, highlight=False)


def _consume_via_server(server, topic, group, expression, sql, limit, follow, access_key,
                        secret_key, fmt) -> None:
    from mqstore.endpoint import client
    try:
        client.check_server(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    show = {"json": _server_json_lines, "table": _server_table, "value": _server_values}[fmt]
    with stop_on_signals() as stop:
        try:
            count = client.consume(server, topic, group, expression, sql, limit, follow, stop,
                                   show, access_key=access_key, secret_key=secret_key)
        except ImportError as exc:
            raise click.ClickException(f"--server needs the grpc extra ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - the client's refusals carry RocketMQ's code
            raise click.ClickException(f"{server}: receive failed: {exc}") from None
    if fmt != "json":
        output.err().print(f"{count} message(s) received and acknowledged by group {group!r}",
                           markup=False, highlight=False)


def _server_json_lines(rows: list[dict]) -> int:
    for i, row in enumerate(rows):
        try:
            click.echo(json.dumps(row, ensure_ascii=False))
        except BrokenPipeError:
            _output_gone()
            return i
    return len(rows)


def _server_values(rows: list[dict]) -> int:
    """Each body, byte for byte, and a newline."""
    stdout = sys.stdout.buffer
    for i, row in enumerate(rows):
        try:
            stdout.write(base64.b64decode(row["body_base64"]) + b"\n")
            stdout.flush()
        except BrokenPipeError:
            _output_gone()
            return i
    return len(rows)


def _server_table(rows: list[dict]) -> int:
    try:
        output.print_table(SERVER_COLUMNS, [
            (r["msg_id"], r["delivery_attempt"], r["tags"], " ".join(r["keys"]),
             " ".join(f"{k}={v}" for k, v in sorted(r["properties"].items())),
             r["body"] if r["body"] is not None else r["body_base64"]) for r in rows],
            whole=("msg id",))
    except BrokenPipeError:
        _output_gone()
        return 0
    return len(rows)


def _json_lines(messages: Sequence) -> int:
    for i, m in enumerate(messages):
        try:
            # click.echo flushes: a line that left the process counts as printed.
            click.echo(json.dumps(message_dict(m.full), ensure_ascii=False))
        except BrokenPipeError:
            _output_gone()
            return i
    return len(messages)


def _values(messages: Sequence) -> int:
    """Each body, byte for byte, and a newline (kafka-console-consumer's default)."""
    stdout = sys.stdout.buffer
    for i, m in enumerate(messages):
        try:
            stdout.write(m.body + b"\n")
            stdout.flush()  # a body that left the process counts as printed
        except BrokenPipeError:
            _output_gone()
            return i
    return len(messages)


def _table(messages: Sequence) -> int:
    rows = []
    for m in messages:
        d = message_dict(m.full)
        props = "\n".join(f"{name}={value}" for name, value in d["properties"].items()
                          if name not in IN_COLUMNS)
        body = shown(d["body"])
        body = body if body is not None else f"base64:{d['body_base64']}"
        rows.append((d["queue_id"], d["queue_offset"], d["msg_id"], d["uniq_key"], d["tags"],
                     " ".join(d["keys"]), props, body))
    try:
        # rich writes and flushes the table whole
        output.print_table(COLUMNS, rows, whole=("msg id", "uniq key"))
    except BrokenPipeError:
        _output_gone()
        return 0
    return len(messages)


PRINTERS = {"value": _values, "json": _json_lines, "table": _table}


def _output_gone() -> None:
    """The reader of our standard output went away (``| head``): what is left to write goes
    nowhere, so the interpreter's final flush does not fail with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
