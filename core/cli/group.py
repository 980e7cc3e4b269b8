"""``mqstore group list|describe|reset-offset|delete|config|dlq DIR ...``: consumer groups, as
``mqadmin`` consumerProgress, resetOffsetByTime and deleteSubGroup see them; with ``--server
HOST:PORT`` those of the store a running ``mqstore serve`` holds open."""

from __future__ import annotations

import datetime

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, epoch_ms, json_option
from mqstore.cli.stats import _age
from mqstore.cli.topic import admin_server_options, admin_target


@click.group()
def group() -> None:
    """List, describe, reset and delete the consumer groups of a store.

    Their committed offsets (config/consumerOffset.json) and pop state. The store is opened
    read-only: the commands run on a closed store and beside a running writer; with --server
    they run in the `mqstore serve` holding it open.
    """


@group.command("list")
@admin_target()
@config_option
@admin_server_options
@json_option
def list_(admin, as_json: bool) -> None:
    """List the consumer groups of the store in ROOT.

    Every group with offsets or pop state, per topic: its queues, its lag (messages not
    consumed) and its live instances.
    """
    rows = admin.group_list()
    if as_json:
        output.emit_json(rows)
        return
    output.print_table(("group", "topic", "queues", "lag", "live instances"),
                       [(r["group"], r["topic"], r["queues"], r["lag"], r["live_instances"])
                        for r in rows])


@group.command("describe")
@admin_target("name")
@click.option("-t", "--topic", default=None, help="Only this topic (default: every topic).")
@config_option
@admin_server_options
@json_option
def describe(admin, name: str, topic: str | None, as_json: bool) -> None:
    """Show group NAME's offsets and lag, per queue.

    Per queue: committed offset, min and max offset, lag and the age of the oldest message
    the group has not consumed.
    """
    topics = admin.group_describe(name, topic)
    if as_json:
        output.emit_json(topics)
        return
    for t in topics:
        output.print_table(
            ("queue", "committed offset", "min offset", "max offset", "lag",
             "oldest unconsumed"),
            [(q["queue_id"], q["committed_offset"], q["min_offset"], q["max_offset"], q["lag"],
              _age(q["oldest_unconsumed_age_ms"]) if q["lag"] else "") for q in t["queues"]],
            title=f"group {name} on topic {t['topic']}: lag {t['lag']}, "
                  f"{t['live_instances']} live instance(s)")


def _time(_ctx, _param, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return epoch_ms(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not epoch milliseconds or an ISO-8601 time "
                                 f"(e.g. 2024-05-01T12:00:00)") from None


@group.command("reset-offset")
@admin_target("name")
@click.option("-t", "--topic", required=True, help="Topic whose offsets are reset.")
@click.option("--offset", type=click.IntRange(0), default=None,
              help="The queue offset to go on from (clamped to each queue's min and max).")
@click.option("--time", "timestamp_ms", callback=_time, default=None, metavar="TIME",
              help="Go on from the first message stored at or after TIME (epoch ms or "
                   "ISO-8601, local time unless it names a zone): RocketMQ's "
                   "resetOffsetByTime.")
@click.option("-q", "--queue", "queue_id", type=click.IntRange(0), default=None,
              help="Only this queue (default: every queue of the topic).")
@config_option
@admin_server_options
@json_option
def reset_offset(admin, name: str, topic: str, offset: int | None, timestamp_ms: int | None,
                 queue_id: int | None, as_json: bool) -> None:
    """Move group NAME's committed offsets of a topic.

    Its next consumer, and its next pop, go on from there; its pop deliveries in flight are
    forgotten.

    Refused while instances of the group consume the topic: stop them first.
    """
    if (offset is None) == (timestamp_ms is None):
        raise click.UsageError("give exactly one of --offset and --time")
    result = admin.group_reset(name, topic, offset=offset, timestamp_ms=timestamp_ms,
                               queue_id=queue_id)
    if as_json:
        output.emit_json(result)
        return
    output.print_table(("queue", "before", "after", "min offset", "max offset"),
                       [(q["queue_id"], "-" if q["before"] is None else q["before"], q["after"],
                         q["min_offset"], q["max_offset"]) for q in result["queues"]],
                       title=f"group {name} on topic {topic}: offsets reset")


@group.command("delete")
@admin_target("name")
@click.option("-t", "--topic", default=None, help="Only this topic (default: every topic).")
@click.confirmation_option(prompt="Delete the group's offsets and pop state?",
                           help="Delete without asking.")
@config_option
@admin_server_options
@json_option
def delete(admin, name: str, topic: str | None, as_json: bool) -> None:
    """Forget group NAME.

    Its committed offsets and pop state (of one topic, or all) and its membership files go;
    it no longer holds back cleanup.policy: keep_unconsumed.

    Refused while instances of the group consume: stop them first.
    """
    result = admin.group_delete(name, topic)
    if as_json:
        output.emit_json(result)
    else:
        output.say(f"deleted group {name}: offsets and pop state of topic(s) "
                   f"{', '.join(result['topics'])}")


@group.command("config")
@admin_target("name")
@click.option("--retry-max-times", type=int, default=None,
              help="Retries before a message goes to %DLQ%NAME: a pop consumer gets "
                   "retry-max-times + 1 deliveries (RocketMQ's retryMaxTimes, default 16).")
@click.option("--retry-queue-nums", type=int, default=None,
              help="Queues of %RETRY%NAME (retryQueueNums, default 1).")
@click.option("--consume-enable/--no-consume-enable", default=None,
              help="consumeEnable (kept for RocketMQ brokers reading the file).")
@click.option("--broadcast/--no-broadcast", "consume_broadcast_enable", default=None,
              help="consumeBroadcastEnable (kept for RocketMQ brokers reading the file).")
@click.option("--orderly/--no-orderly", "consume_message_orderly", default=None,
              help="consumeMessageOrderly: a FIFO group (each queue delivered in order, the "
                   "next message only after the earlier ones are acked or dead-lettered).")
@config_option
@admin_server_options
@json_option
def config(admin, name: str, as_json: bool, **fields) -> None:
    """Show group NAME's config, or change the fields given.

    The config is RocketMQ's, in config/subscriptionGroup.json (a broker's file is read and
    rewritten as the broker writes it); a group not listed there has the defaults.
    """
    changes = {k: v for k, v in fields.items() if v is not None}
    result = admin.group_config_set(name, **changes) if changes else admin.group_config(name)
    if as_json:
        output.emit_json(result)
        return
    output.print_table(("field", "value"), [(k, v) for k, v in result.items() if k != "group"],
                       title=f"group {name}" + ("" if result["listed"] else " (defaults)"))


@group.command("dlq")
@admin_target("name")
@click.option("--resend", is_flag=True,
              help="Send the chosen dead letters again to their original topics.")
@click.option("--offset", "offsets", type=click.IntRange(0), multiple=True,
              help="With --resend: the dead letter at this offset of %DLQ%NAME (repeatable).")
@click.option("--id", "ids", multiple=True,
              help="With --resend: the dead letter of this message id (repeatable).")
@click.option("--all", "every", is_flag=True, help="With --resend: every dead letter.")
@config_option
@admin_server_options
@json_option
def dlq(admin, name: str, resend: bool, offsets: tuple, ids: tuple, every: bool,
        as_json: bool) -> None:
    """List group NAME's dead letters (%DLQ%NAME), or resend chosen ones.

    Each: its offset in the DLQ, the message id, its original topic, the deliveries it had
    and when it was dead-lettered. --resend puts a copy of each chosen one to its original
    topic (delivered afresh; the dead letter stays), as RocketMQ's dashboard does; on a
    running store, use --server.
    """
    if not resend:
        if offsets or ids or every:
            raise click.UsageError("--offset, --id and --all choose what --resend sends")
        rows = admin.group_dlq(name)
        if as_json:
            output.emit_json(rows)
            return
        output.print_table(
            ("offset", "id", "origin topic", "attempts", "dead-lettered"),
            [(r["offset"], r["id"], r["origin_topic"], r["attempts"],
              _when(r["store_time_ms"])) for r in rows],
            title=f"group {name}: {len(rows)} dead letter(s) in %DLQ%{name}", whole=("id",))
        return
    if not (offsets or ids or every):
        raise click.UsageError("--resend needs --offset, --id or --all")
    result = admin.group_dlq_resend(name, list(offsets) or None, list(ids) or None, every)
    if as_json:
        output.emit_json(result)
        return
    output.print_table(("offset", "id", "to topic", "queue", "queue offset"),
                       [(r["offset"], r["id"], r["topic"], r["queue_id"], r["queue_offset"])
                        for r in result["resent"]],
                       title=f"group {name}: {len(result['resent'])} dead letter(s) resent",
                       whole=("id",))


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
