"""How long a store takes to open again: after a clean close, without the marker, after a kill.

One store (default configuration: 1 GiB segments, dispatch and flush in worker processes) gets
``--count`` messages of ``--body-bytes`` (columnar ``put_batch`` of 1,000, 4 queues, no keys
unless ``--keys``) and is closed. Then, with ``time.perf_counter`` around ``MessageStore.open``:

1. ``clean``     -- ``--rounds`` reopens (each closed again), trusting the clean-shutdown marker
                    ``mqstore.clean`` the close left: no record walked, nothing re-dispatched;
2. ``read-only`` -- the same, opened read-only;
3. ``old path``  -- the marker deleted first: the recovery every open ran before it, a record
                    walk from the start of the newest dispatched segment and, with no key in
                    the log, a re-dispatch of all of it. Its time over ``clean``'s is the ratio;
4. ``abnormal``  -- for each count in ``--abnormal-extra``, a writer process opens the store,
                    waits until the derived files' flush has recorded the whole log in
                    ``mqstore.queued``, appends that many messages and is killed with SIGKILL
                    (its whole process group) at once: the reopen recovers from the mark.
                    Printed per count: the bytes past the mark, the bytes walked and
                    re-dispatched, the time, and the checkpoint's flushed offset. The target
                    is a walk of exactly the bytes past the mark, so the time grows with them
                    and not with the log (without the mark, RocketMQ's rule walks from the
                    newest segment older than the checkpoint's times: with one segment, all
                    of it).

Every open is checked: the same end, every queue's max offset, no message lost. The store goes
to a fresh directory under the system temp dir (``TMPDIR`` to choose another filesystem) and is
deleted afterwards; 1M x 256 B is some 360 MB (a 1 GiB segment file, sparse-free: reserved).
Target: the clean reopen of ~1 GB (``--count 3000000``) under 200 ms; PASS/MISS never fails the
process. The page cache is warm throughout (the store was just written): these are not cold
reads from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from benchlib import emit_json, load_config_compat
from mqstore import MessageBatch, MessageStore, PutStatus

TOPIC = "ReopenTopic"
QUEUES = 4
BATCH = 1000
TARGET_S = 0.200
MARKER = "mqstore.clean"  # storage.clean_marker.MARKER_FILE, spelled out for older revisions
QUEUED = "mqstore.queued"  # storage.queue_progress.QUEUED_FILE, likewise

# The writer that is killed: opens the store, waits until mqstore.queued covers everything,
# appends, says so at once.
KILLED_WRITER = r"""
import json, os, sys, time
sys.path.insert(0, {bench_dir!r})
from benchlib import load_config_compat
from mqstore import MessageBatch, MessageStore
store = MessageStore.open({root!r}, load_config_compat(json.loads({overrides!r})))
store.wait_dispatched(600)
end = store.max_phys_offset
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with open(os.path.join({root!r}, {queued!r})) as f:
            phys, size, _ts = json.load(f)["record"]
        if phys + size >= end:
            break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.05)
for i in range(0, {extra}, 1000):
    store.put_batch(MessageBatch({topic!r}, [b"k" * {body}] * min(1000, {extra} - i),
                                 queue_ids=(i // 1000) % {queues}))
print("ready", flush=True)
time.sleep(3600)
"""


def overrides(segment_mib: int) -> dict:
    """The default configuration (the key index on, whether or not messages have keys)."""
    out = {"plugins": {"load_entry_points": False}}
    if segment_mib:
        out["commit_log"] = {"segment_bytes": segment_mib << 20}
    return out


def per_queue(count: int) -> list[int]:
    """Messages per queue after ``count`` written in batches of BATCH, queue by batch."""
    return [sum(min(BATCH, count - s) for s in range(q * BATCH, count, QUEUES * BATCH))
            for q in range(QUEUES)]


def write_store(root: str, cfg, count: int, body_bytes: int, keys: bool) -> tuple[int, float]:
    body = [b"x" * body_bytes] * BATCH
    began = time.perf_counter()
    with MessageStore.open(root, cfg) as store:
        for i in range(0, count, BATCH):
            n = min(BATCH, count - i)
            batch = MessageBatch(TOPIC, body[:n], queue_ids=(i // BATCH) % QUEUES,
                                 keys=[[f"k{i + j}"] for j in range(n)] if keys else None)
            res = store.put_batch(batch)
            if res.status is not PutStatus.PUT_OK:
                raise SystemExit(f"put_batch failed: {res.status.name} {res.error}")
        store.wait_dispatched(600)
        end = store.max_phys_offset
    return end, time.perf_counter() - began


def timed_open(root: str, cfg, *, read_only: bool = False):
    began = time.perf_counter()
    store = MessageStore.open(root, cfg, read_only=read_only)
    seconds = time.perf_counter() - began
    report = store.recovery_report
    offsets = [store.max_offset(TOPIC, q) for q in range(QUEUES)]
    end = store.max_phys_offset
    store.close()
    return seconds, report, end, offsets


def checkpoint_fields(root: str) -> dict:
    with open(os.path.join(root, "checkpoint"), "rb") as f:
        physic, logics, index, _master, confirm = struct.unpack(">qqqqq", f.read(40))
    return {"physic": physic, "logics": logics, "index": index, "confirm": confirm}


def kill_a_writer(root: str, ovr: dict, extra: int, body: int) -> None:
    script = KILLED_WRITER.format(bench_dir=os.path.dirname(os.path.abspath(__file__)),
                                  root=root, overrides=json.dumps(ovr), extra=extra,
                                  topic=TOPIC, body=body, queues=QUEUES, queued=QUEUED)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise SystemExit(f"the writer to kill did not get ready: {line!r}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the store and its workers, as the OOM killer
        proc.wait()
    if not os.path.exists(os.path.join(root, "abort")):
        raise SystemExit("the killed writer left no abort file")


def queued_phys(root: str) -> int | None:
    """Where ``mqstore.queued``'s record starts (None: no such file, an older revision)."""
    try:
        with open(os.path.join(root, QUEUED), encoding="utf-8") as f:
            return json.load(f)["record"][0]
    except (OSError, ValueError, KeyError):
        return None


def abnormal_rounds(root: str, cfg, ovr: dict, extras: list[int], body: int,
                    want: list) -> tuple[list, bool]:
    """Kill a writer after each count of ``extras`` and time the reopen; returns the metrics
    and whether every walk covered exactly the bytes past the mark."""
    metrics, exact = [], True
    for extra in extras:
        kill_a_writer(root, ovr, extra, body)
        cp, mark = checkpoint_fields(root), queued_phys(root)
        ab_s, ab_report, ab_end, offsets = timed_open(root, cfg)
        want[:] = [a + b for a, b in zip(want, per_queue(extra))]
        check("abnormal reopen", ab_end, offsets, ab_end, want)
        walked = ab_report.commit_log_end - ab_report.scan_from
        past = None if mark is None else ab_end - mark
        exact &= past == walked
        print(f"abnormal {extra:>7,} msgs {ab_s * 1e3:8.1f} ms (writer killed): "
              f"{'no ' + QUEUED if past is None else f'{past:,} bytes past {QUEUED}'}; walked "
              f"{walked:,} bytes from {ab_report.scan_from:,} ({ab_report.records_checked:,} "
              f"records), re-dispatched {ab_report.redispatch_bytes:,}; checkpoint flushed to "
              f"{cp['confirm']:,}, {ab_end - cp['confirm']:,} bytes beyond it")
        metrics += [(f"abnormal_reopen_ms_{extra}", ab_s * 1e3, "ms", "lower"),
                    (f"abnormal_walked_mb_{extra}", walked / 1e6, "MB", "lower")]
    return metrics, exact


def check(what: str, end: int, offsets: list, want_end: int, want_offsets: list) -> None:
    if end != want_end or offsets != want_offsets:
        raise SystemExit(f"{what}: end {end}, queue offsets {offsets}; expected {want_end}, "
                         f"{want_offsets}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--body-bytes", type=int, default=256)
    ap.add_argument("--keys", action="store_true", help="a unique key per message")
    ap.add_argument("--segment-mib", type=int, default=0, help="0: the default (1024)")
    ap.add_argument("--rounds", type=int, default=5, help="clean reopens timed")
    ap.add_argument("--abnormal-extra", default="0,10000,100000",
                    help="messages each killed writer appends past the mark, comma-separated")
    ap.add_argument("--skip-abnormal", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    ovr = overrides(args.segment_mib)
    cfg = load_config_compat(ovr)
    tmp = tempfile.mkdtemp(prefix="mqstore-bench-reopen-")
    root = os.path.join(tmp, "store")
    try:
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {args.count:,} x "
              f"{args.body_bytes} B, keys {'on' if args.keys else 'off'}, segment "
              f"{cfg.commit_log.segment_bytes >> 20} MiB, temp {tmp}")
        end, wrote_s = write_store(root, cfg, args.count, args.body_bytes, args.keys)
        want = per_queue(args.count)
        print(f"wrote     {end / 1e6:10,.1f} MB in {wrote_s:6.2f} s, closed "
              f"({'marker left' if os.path.exists(os.path.join(root, MARKER)) else 'NO MARKER'})")

        clean = []
        for _ in range(args.rounds):
            seconds, report, got_end, offsets = timed_open(root, cfg)
            check("clean reopen", got_end, offsets, end, want)
            clean.append(seconds)
        median = statistics.median(clean)
        print(f"clean     median {median * 1e3:8.1f} ms, best {min(clean) * 1e3:7.1f} ms over "
              f"{len(clean)} reopens; records checked {report.records_checked}, bytes "
              f"re-dispatched {report.redispatch_bytes}, trusted end "
              f"{getattr(report, 'trusted_end', 'n/a')}")
        ro_s, ro_report, got_end, offsets = timed_open(root, cfg, read_only=True)
        check("read-only reopen", got_end, offsets, end, want)
        print(f"read-only         {ro_s * 1e3:8.1f} ms; records checked "
              f"{ro_report.records_checked}")

        if os.path.exists(os.path.join(root, MARKER)):
            os.remove(os.path.join(root, MARKER))
        old_s, old_report, got_end, offsets = timed_open(root, cfg)
        check("old-path reopen", got_end, offsets, end, want)
        ratio = old_s / median
        print(f"old path          {old_s * 1e3:8.1f} ms (marker deleted): records checked "
              f"{old_report.records_checked:,}, bytes re-dispatched "
              f"{old_report.redispatch_bytes:,}; old / clean = {ratio:,.0f}x")

        metrics = [("clean_reopen_ms", median * 1e3, "ms", "lower"),
                   ("read_only_reopen_ms", ro_s * 1e3, "ms", "lower"),
                   ("old_path_reopen_ms", old_s * 1e3, "ms", "lower"),
                   ("old_over_clean", ratio, "x", "higher")]
        if not args.skip_abnormal:
            extras = [int(x) for x in args.abnormal_extra.split(",")]
            more, exact = abnormal_rounds(root, cfg, ovr, extras, args.body_bytes, want)
            metrics += more
            print(f"target: an abnormal reopen walks and re-dispatches only the bytes past "
                  f"{QUEUED}: {'PASS' if exact else 'MISS'}")
        verdict = "PASS" if median < TARGET_S else "MISS"
        print(f"target: clean reopen < {TARGET_S * 1e3:.0f} ms for ~1 GB "
              f"({end / 1e9:.2f} GB here): {verdict}")
        if args.json:
            emit_json("reopen", metrics, count=args.count)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
