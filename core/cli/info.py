"""``mqstore info``: a store's queues and offsets, read-only."""

from __future__ import annotations

import click

from mqstore.cli.options import existing_root
from mqstore.store import MessageStore


@click.command()
@existing_root
def info(root: str) -> None:
    """Show a store's queues and offsets (read-only; works on RocketMQ directories)."""
    with MessageStore.open(root, read_only=True) as store:
        rep = store.recovery_report
        click.echo(f"commit log [{store.min_phys_offset}, {store.max_phys_offset}), segment "
                   f"{store.internals.commit_log.segment_bytes} bytes, hash {store.hash_kind}")
        if rep.truncated_bytes or rep.consume_queue_units_dropped:
            click.echo(f"damage: {rep.truncated_bytes} bytes past the last valid record "
                       f"({rep.stop_reason}); units past it: {rep.consume_queue_units_dropped}")
        for topic in store.topics():
            for q in store.queue_ids(topic):
                click.echo(f"{topic}/{q}: [{store.min_offset(topic, q)}, {store.max_offset(topic, q)})")
