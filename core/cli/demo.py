"""``mqstore demo``: the demo job ``make run`` runs, a realistic load written and read back."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib

import click

from mqstore.cli.options import load_cli_config
from mqstore.config import StoreConfig
from mqstore.message import GetStatus, Message, PutStatus, StoredMessage
from mqstore.storage.store_lock import exclusive
from mqstore.store import MessageStore

DEMO_TOPICS = {"orders": 8, "audit-log": 4, "metrics": 4}
DEMO_TAGS = ("created", "paid", "shipped", "cancelled")
# Written into every directory the demo creates or empties; only such a directory is emptied
# again without --force.
DEMO_MARKER = ".mqstore-demo"
DEMO_MARKER_TEXT = "This directory was made by `mqstore demo`; the next demo run empties it.\n"


def _demo_messages(count: int, start: int):
    topics = [(t, q) for t, n in DEMO_TOPICS.items() for q in range(n)]
    bodies = [(f"event payload {'x' * (64 + 97 * k % 900)}").encode() for k in range(16)]
    for i in range(start, start + count):
        topic, queue_id = topics[i % len(topics)]
        yield Message(topic=topic, body=bodies[i % 16] + str(i).encode(), queue_id=queue_id,
                      tags=DEMO_TAGS[(i // 16) % 4], keys=[f"order-{i}"], properties={"seq": str(i)})


def _mark(root: str) -> None:
    with open(os.path.join(root, DEMO_MARKER), "w", encoding="utf-8") as f:
        f.write(DEMO_MARKER_TEXT)


def _empty(root: str) -> None:
    """Delete what ``root`` holds, keeping ``root`` itself (it may be a symlink or a mount)."""
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name == DEMO_MARKER:
                continue  # kept: a run interrupted while emptying is still recognised
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _prepare_root(root: str, fresh: bool, force: bool) -> None:
    """Make ``root`` ready for a demo run, deleting only what an earlier demo run made unless
    ``force`` says otherwise."""
    if not os.path.exists(root):
        os.makedirs(root)
        _mark(root)
        return
    names = os.listdir(root)
    if not names:
        _mark(root)
        return
    if not fresh:
        return  # appending: a directory the demo did not make stays unmarked, so never emptied
    if DEMO_MARKER not in names and not force:
        raise click.BadParameter(
            f"{root!r} exists, is not empty and was not made by 'mqstore demo' (it has no "
            f"{DEMO_MARKER} file), so the demo will not delete it. Choose another --root, pass "
            f"--keep to append to the store in it, or --force to delete everything in it.",
            param_hint="'--root'")
    with exclusive(root, "mqstore demo --fresh"):  # never a store some process holds open
        _empty(root)
        _mark(root)


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} msg/s" if seconds > 0 else "n/a"


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="YAML config (default: built-in defaults).")
@click.option("--root", type=click.Path(file_okay=False), default=".mqstore-data",
              show_default=True, help="Store directory.")
@click.option("--count", type=click.IntRange(1000, 10_000_000), default=200_000,
              show_default=True, help="Messages written by put_batch.")
@click.option("--fresh/--keep", default=True, show_default=True,
              help="Start from an empty directory, or append to what is there. --fresh empties "
                   "only a directory an earlier demo run made (see --force).")
@click.option("--force", is_flag=True, default=False,
              help="With --fresh, also delete everything in a non-empty --root that no demo "
                   "run made.")
def demo(config_path: str | None, root: str, count: int, fresh: bool, force: bool) -> None:
    """Write a realistic load over several topics and queues, then read it all back.

    The store directory is created if missing. An existing one is emptied first (--fresh) only
    if an earlier demo run made it or --force is given; otherwise the demo stops and touches
    nothing. A store some process holds open for writing is never emptied, even with --force:
    the demo stops, naming that process.
    """
    cfg = _load_demo_config(config_path)
    _prepare_root(root, fresh, force)
    click.echo(f"store {os.path.abspath(root)}  (config {config_path or 'defaults'}, "
               f"flush {cfg.flush.policy}, writer {cfg.writer.kind})")
    with MessageStore.open(root, config=cfg) as store:
        _show_opened(store)
        # With --keep the store already holds messages: numbering and reading start past them.
        before = {(t, q): store.max_offset(t, q) for t, n in DEMO_TOPICS.items() for q in range(n)}
        start_index = sum(before.values())
        msgs = list(_demo_messages(count, start_index))
        _put_batches(store, msgs)
        singles = list(_demo_messages(20_000, start_index + count))
        _put_singly(store, singles)
        _wait_dispatched(store)
        _read_back(store, before, msgs + singles)
        _show_queues(store)
        _show_tag_filter(store, before)
        sample = _show_time_search(store, before)
        _show_key_lookup(store, f"order-{start_index + count // 2}")
        _show_workers(store)
        _show_sample(sample)
        end = store.max_phys_offset
    _show_reopened(root, cfg, end)


def _load_demo_config(config_path: str | None) -> StoreConfig:
    # A bad one is blamed on the option, so click prints usage and the option name.
    return load_cli_config(config_path, "'--config'")


def _show_opened(store: MessageStore) -> None:
    rep = store.recovery_report
    click.echo(f"opened: commit log [{store.min_phys_offset}, {store.max_phys_offset}), "
               f"{'abnormal' if rep.abnormal else 'normal'} recovery, "
               f"{rep.truncated_bytes} bytes cut")


def _put_batches(store: MessageStore, msgs: list[Message]) -> None:
    t0 = time.perf_counter()
    written = 0
    for i in range(0, len(msgs), 1000):
        res = store.put_batch(msgs[i:i + 1000])
        if res.status is not PutStatus.PUT_OK:
            raise click.ClickException(f"put_batch failed: {res.status.name} {res.error}")
        written += res.wrote_bytes
    dt = time.perf_counter() - t0
    click.echo(f"put_batch: {len(msgs):,} messages, {written / 1e6:,.1f} MB in {dt:.2f} s "
               f"({_rate(len(msgs), dt)}, {written / 1e6 / dt:,.0f} MB/s)")


def _put_singly(store: MessageStore, singles: list[Message]) -> None:
    # one put per message shows the per-call cost next to the batch rate above
    t0 = time.perf_counter()
    for m in singles:
        r = store.put(m)
        if r.status is not PutStatus.PUT_OK:
            raise click.ClickException(f"put failed: {r.status.name} {r.error}")
    dt = time.perf_counter() - t0
    click.echo(f"put:       {len(singles):,} messages in {dt:.2f} s ({_rate(len(singles), dt)})")


def _wait_dispatched(store: MessageStore) -> None:
    # reads go through the consume queues, so they must have caught up with the commit log
    t0 = time.perf_counter()
    store.wait_dispatched(timeout=120)
    click.echo(f"dispatch:  caught up {time.perf_counter() - t0:.2f} s after the last put")


def _body_crcs(messages: list[Message]) -> dict[tuple[str, int], int]:
    """A running CRC of the bodies per queue, in put order: compares all that was written
    without holding a second copy of it."""
    crcs: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic, m.queue_id)
        crcs[key] = zlib.crc32(m.body, crcs.get(key, 0))
    return crcs


def _read_back(store: MessageStore, before: dict[tuple[str, int], int],
               written: list[Message]) -> None:
    expected = _body_crcs(written)  # before the clock starts: only the reads are timed
    t0 = time.perf_counter()
    read = 0
    for (topic, qid), first in before.items():
        offset, crc = first, 0
        while True:
            res = store.get("demo-group", topic, qid, offset, 32)
            if res.status is not GetStatus.FOUND:
                break
            for m in res.messages:
                crc = zlib.crc32(m.body, crc)
            read += len(res.messages)
            offset = res.next_begin_offset
        if crc != expected.get((topic, qid), 0):
            raise click.ClickException(f"{topic}/{qid}: bodies read back differ from those written")
    dt = time.perf_counter() - t0
    click.echo(f"get:       {read:,} messages read back and verified in {dt:.2f} s ({_rate(read, dt)})")


def _show_queues(store: MessageStore) -> None:
    click.echo("queues:")
    for topic in store.topics():
        spans = ", ".join(f"{q}:[{store.min_offset(topic, q)},{store.max_offset(topic, q)})"
                          for q in store.queue_ids(topic))
        click.echo(f"  {topic:10s} {spans}")


def _show_tag_filter(store: MessageStore, before: dict[tuple[str, int], int]) -> None:
    tagged = store.get("demo-group", "orders", 0, before[("orders", 0)], 32, expression="paid")
    click.echo(f"tag filter 'paid' on orders/0: {tagged.status.name}, "
               f"{len(tagged.messages)} messages, next offset {tagged.next_begin_offset}")


def _show_time_search(store: MessageStore, before: dict[tuple[str, int], int]
                      ) -> StoredMessage:
    """Search by the store time of a message from the middle of this run; returns that message."""
    # from the middle of what this run wrote, so the search has messages on both sides
    mid_q = before[("orders", 1)] + (store.max_offset("orders", 1) - before[("orders", 1)]) // 2
    sample = store.get("demo-group", "orders", 1, mid_q, 1).messages[0]
    ts = sample.store_timestamp
    lo = store.offset_by_time("orders", 1, ts, "lower")
    hi = store.offset_by_time("orders", 1, ts, "upper")
    click.echo(f"time search orders/1 @ {ts}: lower {lo}, upper {hi} "
               f"(message at {mid_q} stored then)")
    return sample


def _show_key_lookup(store: MessageStore, key: str) -> None:
    t0 = time.perf_counter()
    hits = [m for topic in DEMO_TOPICS for m in store.query_by_key(topic, key)]
    click.echo(f"key lookup {key!r}: {len(hits)} message(s) at "
               f"{[(m.topic, m.queue_id, m.queue_offset) for m in hits]} in "
               f"{(time.perf_counter() - t0) * 1e3:.2f} ms")


def _show_workers(store: MessageStore) -> None:
    status = store.worker_status()
    click.echo(f"dispatch: {status['mode']}"
               + (f" worker pid {status['pid']}, restarts {status['restarts']}"
                  if status["mode"] == "process" else ""))
    flush = store.internals.flush_client.status()
    click.echo(f"flush: {flush['mode']}"
               + (f" worker pid {flush['pid']}, restarts {flush['restarts']}"
                  if flush["mode"] == "process" else "")
               + f", {flush['fsyncs']} fdatasync calls, flushed to {flush['flushed']}")


def _show_sample(sample: StoredMessage) -> None:
    click.echo("sample message:")
    click.echo(json.dumps({
        "topic": sample.topic, "queue_id": sample.queue_id, "queue_offset": sample.queue_offset,
        "phys_offset": sample.phys_offset, "size": sample.size, "msg_id": sample.msg_id,
        "tags": sample.tags, "keys": sample.keys, "properties": sample.properties,
        "store_timestamp": sample.store_timestamp, "store_host": sample.store_host,
        "body": sample.body[:40].decode(errors="replace") + "...",
    }, indent=2, ensure_ascii=False))


def _show_reopened(root: str, cfg: StoreConfig, end: int) -> None:
    # a clean close must leave nothing for recovery to repair
    with MessageStore.open(root, config=cfg) as store:
        rep = store.recovery_report
        click.echo(f"reopened: commit log ends at {store.max_phys_offset} (was {end}), "
                   f"{'clean' if rep.clean and not rep.abnormal else 'RECOVERED'} "
                   f"({rep.records_checked} records checked)")
