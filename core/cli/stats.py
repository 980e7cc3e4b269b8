"""``mqstore stats DIR``: topics, queues, positions, disk use and cleanup state."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, existing_root, json_option, load_cli_config
from mqstore.ops.stats import store_stats


@click.command()
@existing_root
@click.option("-g", "--group", default=None,
              help="Show only this consumer group: per topic and queue its committed offset, "
                   "lag and oldest unconsumed message (exit status 1 when the store has no "
                   "such group).")
@config_option
@json_option
def stats(root: str, group: str | None, config_path: str | None, as_json: bool) -> None:
    """Show the store in ROOT: topics and queues (min/max offsets, message counts and
    bytes), consumer groups (committed offsets, lag, age of the oldest message not yet
    consumed), dispatch and flush positions, disk use, the cleanup policy's state and
    replication (a master's slaves with their acknowledged offsets and lag, a slave's
    master and its lag), and with coordination.etcd_endpoints the automatic failover's
    state (the leader, its epoch, whether this node may write, why it waits).

    Read-only: works beside a running writer (its live positions are read from its shared
    memory) and on RocketMQ directories. The -c configuration supplies the cleanup settings
    to judge by.
    """
    if group is not None:
        _group(root, group, load_cli_config(config_path), as_json)
        return
    data = store_stats(root, load_cli_config(config_path))
    if as_json:
        output.emit_json(data)
        return
    for section in ("store", "commit_log", "dispatch", "flush", "cleanup"):
        output.print_fields(data[section], title=section.replace("_", " "))
    disk = dict(data["disk"])
    by_entry = disk.pop("by_entry")
    output.print_fields({**disk, **{f"  {k}": v for k, v in by_entry.items()}}, title="disk")
    output.print_table(
        ("topic", "queue", "min offset", "max offset", "messages", "bytes"),
        [(t["topic"], q["queue_id"], q["min_offset"], q["max_offset"], q["messages"],
          q["bytes"]) for t in data["topics"] for q in t["queues"]], title="queues")
    _consumers(data["consumers"], "consumers")
    replication = dict(data["replication"])
    slaves = replication.pop("slaves", None)
    output.print_fields(replication, title="replication")
    if slaves:
        output.print_table(("slave", "acknowledged offset", "lag bytes"),
                           [(s["address"], s["ack_offset"], s["lag_bytes"]) for s in slaves],
                           title="slaves")
    if data["coordination"]["configured"]:
        output.print_fields(data["coordination"], title="coordination")


def _group(root: str, group: str, config, as_json: bool) -> None:
    """The consumers section of one group (the shape ``stats --json`` gives it)."""
    everyone = store_stats(root, config, sections=("consumers",))["consumers"]
    entries = [g for g in everyone if g["group"] == group]
    if not entries:
        known = sorted({g["group"] for g in everyone})
        output.nothing_matched(f"consumer group {group!r} has no offsets in this store (its "
                               f"groups: {', '.join(known) if known else 'none'})")
    if as_json:
        output.emit_json({"consumers": entries})
        return
    _consumers(entries, f"consumer group {group}")
    output.say(f"lag {sum(g['lag'] for g in entries)} message(s) in "
               f"{len(entries)} topic(s)")


def _consumers(entries: list[dict], title: str) -> None:
    output.print_table(
        ("group", "topic", "queue", "committed offset", "max offset", "lag",
         "oldest unconsumed"),
        [(g["group"], g["topic"], q["queue_id"], q["committed_offset"], q["max_offset"],
          q["lag"], _age(q["oldest_unconsumed_age_ms"]) if q["lag"] else "")
         for g in entries for q in g["queues"]], title=title)


def _age(ms: int) -> str:
    """A store-clock age as people read one: 850 ms, 42.0 s, 17 min, 5.2 h, 3.1 d."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 120 * 60_000:
        return f"{ms // 60_000} min"
    if ms < 48 * 3_600_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"
