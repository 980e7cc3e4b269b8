"""``mqstore query DIR key|unique-key|id|time|offset ...``: the store's lookups.

A lookup that finds nothing says so on stderr and exits 1 (``output.nothing_matched``), as
grep does, rather than printing an empty table.
"""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import (
    config_option, epoch_ms, json_option, load_cli_config, store_dir,
)
from mqstore.ops.messages import message_dict, ms_to_iso, preview
from mqstore.store import MessageStore


@click.group()
@click.argument("root", type=click.Path())
@click.pass_context
def query(ctx: click.Context, root: str) -> None:
    """Look messages up in the store in ROOT (read-only; RocketMQ directories too).

    A lookup that finds nothing says so on stderr and exits with status 1, as grep does.
    """
    ctx.obj = root


def _open(ctx: click.Context) -> MessageStore:
    config = load_cli_config(ctx.params["config_path"])
    # ROOT is checked here, not where it is parsed, so `query ROOT key --help` needs no store.
    return ctx.with_resource(MessageStore.open(store_dir(ctx.obj), config=config,
                                               read_only=True))


def _show(messages: list, as_json: bool, extra: dict | None = None,
          none_found: str | None = None) -> None:
    """Print ``messages`` (with ``extra`` fields first); when there are none, the fields
    only, then ``none_found`` on stderr and exit 1."""
    rows = [message_dict(m) for m in messages]
    if as_json:
        output.emit_json({**(extra or {}), "messages": rows})
    else:
        for name, value in (extra or {}).items():
            output.say(f"{name}: {value}")
    if not rows:
        output.nothing_matched(none_found or "no message matched")
    if as_json:
        return
    output.print_table(
        ("commit-log offset", "topic", "queue", "offset", "size", "stored", "tags", "keys",
         "msg id", "body"),
        [(r["phys_offset"], r["topic"], r["queue_id"], r["queue_offset"], r["size"],
          ms_to_iso(r["store_timestamp"]), r["tags"], " ".join(r["keys"]), r["msg_id"],
          preview(r["body"])) for r in rows], whole=("msg id",))


def _no_topic(store: MessageStore, topic: str) -> str | None:
    """What to say when ``topic`` does not exist in ``store`` (None: it does)."""
    if topic in store.topics():
        return None
    return f"topic {topic!r} does not exist in this store"


@query.command("key")
@click.argument("topic")
@click.argument("key")
@click.option("-n", "--max", "max_num", type=click.IntRange(0), default=32, show_default=True,
              help="Newest messages to return at most.")
@click.option("--begin", "begin_ms", type=click.IntRange(0), default=0,
              help="Earliest store time, epoch ms.")
@click.option("--end", "end_ms", type=click.IntRange(0), default=None,
              help="Latest store time, epoch ms (default: no limit).")
@config_option
@json_option
@click.pass_context
def by_key(ctx, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int | None,
           config_path: str | None, as_json: bool) -> None:
    """Messages of TOPIC carrying KEY (a KEYS token or the UNIQ_KEY)."""
    store = _open(ctx)
    found = store.query_by_key(topic, key, max_num, begin_ms, end_ms)
    window = "" if (begin_ms, end_ms) == (0, None) else (
        f" stored between {ms_to_iso(begin_ms) or begin_ms} and "
        f"{ms_to_iso(end_ms) if end_ms is not None else 'now'}")
    _show(found, as_json, none_found=_no_topic(store, topic) or (
        f"no message of topic {topic!r} carries key {key!r}{window}"))


@query.command("unique-key")
@click.argument("topic")
@click.argument("uniq_key")
@config_option
@json_option
@click.pass_context
def by_unique_key(ctx, topic: str, uniq_key: str, config_path: str | None,
                  as_json: bool) -> None:
    """The message of TOPIC whose UNIQ_KEY is UNIQ_KEY."""
    store = _open(ctx)
    found = store.query_by_unique_key(topic, uniq_key)
    _show([found] if found is not None else [], as_json, none_found=_no_topic(store, topic) or (
        f"no message of topic {topic!r} has UNIQ_KEY {uniq_key!r}"))


@query.command("id")
@click.argument("msg_id")
@config_option
@json_option
@click.pass_context
def by_id(ctx, msg_id: str, config_path: str | None, as_json: bool) -> None:
    """The message with offset message id MSG_ID."""
    found = _open(ctx).message_by_id(msg_id)
    _show([found] if found is not None else [], as_json,
          none_found=f"no message of this store has msg id {msg_id!r}")


@query.command("offset")
@click.argument("phys_offset", type=click.IntRange(0))
@config_option
@json_option
@click.pass_context
def by_offset(ctx, phys_offset: int, config_path: str | None, as_json: bool) -> None:
    """The message whose record starts at commit-log offset PHYS_OFFSET."""
    found = _open(ctx).message_at(phys_offset)
    _show([found] if found is not None else [], as_json,
          none_found=f"no message starts at commit-log offset {phys_offset}")


def _timestamp(_ctx, _param, value: str) -> int:
    try:
        return epoch_ms(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither epoch milliseconds nor an ISO-8601 "
                                 f"time") from None


@query.command("time")
@click.argument("topic")
@click.argument("queue_id", type=click.IntRange(0))
@click.argument("timestamp", callback=_timestamp)
@click.option("--boundary", type=click.Choice(["lower", "upper"]), default="lower",
              show_default=True,
              help="lower: the first message stored at or after TIMESTAMP; upper: the last "
                   "stored at or before it.")
@config_option
@json_option
@click.pass_context
def by_time(ctx, topic: str, queue_id: int, timestamp: int, boundary: str,
            config_path: str | None, as_json: bool) -> None:
    """The queue offset of TOPIC/QUEUE_ID by store time (epoch ms or ISO-8601), and the
    message there."""
    store = _open(ctx)
    missing = _no_topic(store, topic)
    if missing is None and queue_id not in store.queue_ids(topic):
        missing = (f"topic {topic!r} has no queue {queue_id} (its queues: "
                   f"{', '.join(map(str, store.queue_ids(topic)))})")
    if missing is not None:
        output.nothing_matched(missing)
    offset = store.offset_by_time(topic, queue_id, timestamp, boundary)
    found = store.get("mqstore-cli", topic, queue_id, offset, 1)
    # The search answers the nearest message when none is on the asked side of TIMESTAMP.
    messages = [m for m in (found.messages[:1] if found is not None else [])
                if (m.store_timestamp >= timestamp if boundary == "lower"
                    else m.store_timestamp <= timestamp)]
    side = "at or after" if boundary == "lower" else "at or before"
    _show(messages, as_json, {"topic": topic, "queue_id": queue_id, "timestamp": timestamp,
                              "boundary": boundary, "queue_offset": offset},
          none_found=f"no message of {topic}/{queue_id} was stored {side} "
                     f"{ms_to_iso(timestamp) or timestamp}")
