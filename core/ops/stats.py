"""``mqstore stats``: a store's state as one JSON-ready dict, read-only beside a writer.

Sections: ``store``, ``commit_log``, ``topics`` (every queue: offsets, messages, bytes),
``consumers`` (every group and topic: per queue the committed offset, lag and oldest
unconsumed message's age), ``dispatch``, ``flush``, ``disk``, ``cleanup``, ``replication``
(a master's slaves and their lag, a slave's master and its lag). Each is built by
its own function listed in ``SECTIONS``; a new concern is one more entry there and one more
key in the output, and per-queue dicts take new fields without changing shape.

A running writer is found by its ``abort`` marker; its live positions (written, flushed,
dispatched, fsyncs) are read from its shared-memory segment, attached read-only. Without
one, the positions come from the files (checkpoint, consume queues).
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from mqstore.runtime import cleanup
from mqstore.config import StoreConfig
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.errors import CorruptStateError
from mqstore.format.schedule import SCHEDULE_TOPIC, TIMER_TOPIC, level_of_queue
from mqstore.ops.consumer_lag import group_lags
from mqstore.ops.coordination_file import read_coordination
from mqstore.storage.delay_offsets import read_delay_offsets
from mqstore.storage.timer_progress import read_timer_progress
from mqstore.ops.store_files import abort_state
from mqstore.storage.checkpoint import Checkpoint
from mqstore.storage.shared_segment import path_segment_name, store_segment_name
from mqstore.storage.store_id import recorded_id
from mqstore.store import MessageStore
from mqstore.lifecycle.store_meta import load_meta
from mqstore.read.time_search import store_time_at
from mqstore.replication.status_file import read_status
from mqstore.storage.role_file import read_role
from mqstore.runtime.workers import shm

HOUR_MS = 3_600_000


def store_stats(root: str, config: StoreConfig, now_ms: int | None = None,
                sections: tuple[str, ...] | None = None) -> dict:
    """Every section of ``SECTIONS`` (or those named in ``sections``), by name."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    state, pid = abort_state(root)
    with MessageStore.open(root, config=config, read_only=True) as store, \
            _live_channels(root, state) as live:
        ctx = {"root": os.path.abspath(root), "store": store, "config": config, "now": now_ms,
               "writer": state, "pid": pid, "live": live}
        return {name: build(ctx) for name, build in SECTIONS
                if sections is None or name in sections}


@contextlib.contextmanager
def _live_channels(root: str, writer_state: str):
    """The running writer's shared positions, attached (never created or unlinked); None
    when no writer runs or it is closing."""
    channels = None
    if writer_state == "running":
        store_id = recorded_id(load_meta(root)[0])
        name = (store_segment_name(store_id, shm.POSITIONS_SEGMENT) if store_id
                else path_segment_name(root, shm.POSITIONS_SEGMENT))
        try:
            channels = shm.Channels(shm.SharedPositions(name))
        except (FileNotFoundError, ValueError):
            channels = None
    try:
        yield channels
    finally:
        if channels is not None:
            channels.positions.close()


def _store(ctx) -> dict:
    store = ctx["store"]
    qdir = os.path.join(ctx["root"], "quarantine")
    return {"root": ctx["root"], "hash": store.hash_kind, "writer": ctx["writer"],
            "writer_pid": ctx["pid"] if ctx["writer"] == "running" else None,
            "quarantined_regions": len(os.listdir(qdir)) if os.path.isdir(qdir) else 0}


def _commit_log(ctx) -> dict:
    store = ctx["store"]
    segs = store.internals.commit_log.segments.segments
    return {"min_offset": store.min_phys_offset, "max_offset": store.max_phys_offset,
            "bytes": max(0, store.max_phys_offset - max(store.min_phys_offset, 0)),
            "segments": len(segs), "segment_bytes": store.internals.commit_log.segment_bytes}


def _queue_bytes(cq) -> int:
    total = 0
    for seg in cq.segments.segments:
        units = cq.units_of(seg)[:seg.wrote // CQ_UNIT_SIZE]
        first = max(0, (cq.min_logic_offset - seg.start) // CQ_UNIT_SIZE)
        sizes = units["size"][first:].astype(np.int64)
        total += int(sizes[(sizes > 0) & (sizes != FILLER_SIZE)].sum())
    return total


def _topics(ctx) -> list[dict]:
    store = ctx["store"]
    out = []
    for topic in store.topics():
        queues = []
        for qid in store.queue_ids(topic):
            lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
            cq = store.consume_queue(topic, qid)
            queues.append({"queue_id": qid, "min_offset": lo, "max_offset": hi,
                           "messages": hi - lo, "bytes": _queue_bytes(cq) if cq else 0})
        out.append({"topic": topic, "messages": sum(q["messages"] for q in queues),
                    "bytes": sum(q["bytes"] for q in queues), "queues": queues})
    return out


def _consumers(ctx) -> list[dict]:
    return [g.as_dict() for g in group_lags(ctx["store"])]


def _dispatch(ctx) -> dict:
    store, live = ctx["store"], ctx["live"]
    covered = max((cq.max_phys for cq in store.consume_queues.values()), default=-1)
    out = {"consume_queues_cover": max(covered, 0),
           "consume_queue_lag_bytes": max(0, store.max_phys_offset - max(covered, 0))}
    if live is not None:
        out.update(live=True, dispatched=live.dispatch.dispatched,
                   lag_bytes=max(0, live.append.confirmed - live.dispatch.dispatched),
                   failing=live.dispatch.fails > 0)
    else:
        out["live"] = False
    return out


def _flush(ctx) -> dict:
    cp = Checkpoint(ctx["root"], read_only=True)
    out = {"checkpoint_flushed": cp.confirm_phy_offset,
           "physic_msg_timestamp": cp.physic_msg_timestamp,
           "logics_msg_timestamp": cp.logics_msg_timestamp,
           "index_msg_timestamp": cp.index_msg_timestamp}
    live = ctx["live"]
    if live is not None:
        out.update(live=True, written=live.append.written, committed=live.flush.committed,
                   flushed=live.flush.flushed,
                   lag_bytes=max(0, live.append.written - live.flush.flushed),
                   fsyncs=live.flush.fsyncs, fsync_seconds=live.flush.fsync_ns / 1e9)
    else:
        out["live"] = False
    return out


def _disk(ctx) -> dict:
    root = ctx["root"]
    used: dict[str, int] = {}
    for name in sorted(os.listdir(root)):
        used[name] = _allocated(os.path.join(root, name))
    st = os.statvfs(root)
    return {"store_bytes": sum(used.values()), "by_entry": used,
            "filesystem_bytes": st.f_blocks * st.f_frsize,
            "filesystem_free_bytes": st.f_bavail * st.f_frsize,
            "used_ratio": cleanup.disk_used_ratio(root)}


def _allocated(path: str) -> int:
    """Bytes the file system allocated (sparse files count what they hold)."""
    if not os.path.isdir(path):
        return os.lstat(path).st_blocks * 512
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _cleanup(ctx) -> dict:
    store, config, now = ctx["store"], ctx["config"], ctx["now"]
    cfg = config.cleanup
    ratio = cleanup.disk_used_ratio(ctx["root"])
    decision = store.internals.hooks.cleanup_policies.get(cfg.policy)(config).decide(now, ratio)
    reserved_ms = int(cfg.file_reserved_hours * HOUR_MS)
    segs = store.internals.commit_log.segments.segments
    oldest = store_time_at(store.internals.commit_log, segs[1].start) if len(segs) > 1 else -1
    return {"policy": cfg.policy, "delete_when": cfg.delete_when,
            "file_reserved_hours": cfg.file_reserved_hours,
            "disk_used_ratio": ratio,
            **_watermarks(cfg, ratio),
            "would_delete_now": decision.delete, "disk_full": bool(decision.disk_full),
            "expired_segments": cleanup.expired_count(store.internals.commit_log, now, reserved_ms,
                                                      len(segs)),
            "oldest_segment_age_ms": now - oldest if oldest > 0 else None}


def _watermarks(cfg, ratio) -> dict:
    """Each cleanup watermark as configured (a fraction of the disk in use, or an amount of
    free space such as "20GiB") and whether the disk is past it now."""
    out = {}
    for name in ("disk_max_used_ratio", "disk_forcibly_ratio", "disk_warning_ratio"):
        value = getattr(cfg, name)
        out[name] = value / 100 if isinstance(value, int) else f"{value} free"
        out[name.removesuffix("_ratio") + "_passed"] = cleanup.watermark_passed(value, ratio)
    return out


def _replication(ctx) -> dict:
    """What the running store's replication last wrote (``replication.json``): live while
    that store runs; otherwise the configured role and, if any, the last state it left."""
    status = read_status(ctx["root"])
    live = ctx["writer"] == "running" and status is not None and status.get("running", False)
    if status is None:
        record, _problem = read_role(ctx["root"])  # a run-time role wins over store.role
        return {"live": False, "role": record.role if record else ctx["config"].store.role}
    return {**status, "live": live}


def _schedule(ctx) -> dict:
    """Each delay level's next offset (``delayOffset.json``), queue end and pending messages;
    the timers' progress (``mqstore_timers.json``) and their queue's end (docs/delays.md)."""
    store, root = ctx["store"], ctx["root"]
    try:
        doc, timers = read_delay_offsets(root), read_timer_progress(root)
    except CorruptStateError as exc:
        return {"error": str(exc)}
    table = doc.table if doc is not None else {}
    levels = {}
    for queue_id in store.queue_ids(SCHEDULE_TOPIC):
        level, end = level_of_queue(queue_id), store.max_offset(SCHEDULE_TOPIC, queue_id)
        nxt = table.get(level, 0)
        levels[str(level)] = {"next": nxt, "max_offset": end, "pending": max(0, end - nxt)}
    queued = store.max_offset(TIMER_TOPIC, 0) if store.queue_ids(TIMER_TOPIC) else 0
    return {"levels": levels, "timers": {
        "queued": queued, "queue_offset": timers.queue_offset if timers else 0,
        "read_time_ms": timers.read_time_ms if timers else 0}}


def _coordination(ctx) -> dict:
    """What the running store's automatic failover last wrote (``coordination.json``: the
    leader, its epoch, whether this node may write, why it waits): live while that store
    runs; ``{"configured": false}`` without ``coordination.etcd_endpoints``."""
    if not ctx["config"].coordination.etcd_endpoints:
        return {"configured": False}
    status = read_coordination(ctx["root"]) or {}
    return {**status, "configured": True, "live": ctx["writer"] == "running" and bool(status)}


SECTIONS = (("store", _store), ("commit_log", _commit_log), ("topics", _topics),
            ("consumers", _consumers), ("dispatch", _dispatch), ("flush", _flush), ("disk", _disk),
            ("cleanup", _cleanup), ("replication", _replication), ("schedule", _schedule),
            ("coordination", _coordination))
