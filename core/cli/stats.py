"""``mqstore stats DIR``: topics, queues, positions, disk use and cleanup state."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, existing_root, json_option, load_cli_config
from mqstore.ops.stats import store_stats


@click.command()
@existing_root
@config_option
@json_option
def stats(root: str, config_path: str | None, as_json: bool) -> None:
    """Show the store in ROOT: topics and queues (min/max offsets, message counts and
    bytes), dispatch and flush positions, disk use and the cleanup policy's state.

    Read-only: works beside a running writer (its live positions are read from its shared
    memory) and on RocketMQ directories. The -c configuration supplies the cleanup settings
    to judge by.
    """
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
