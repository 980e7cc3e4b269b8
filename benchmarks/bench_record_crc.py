"""What the whole-record CRC (``commit_log.record_crc``) costs: the same work with it off and on.

For each body size one round writes N messages as columnar ``MessageBatch`` puts of 1,000
(timed until dispatched, so readable), reads the queue back with ``store.read`` (1,000 rows a
call) and with ``get`` (32 a call), once with ``record_crc: false`` and once with ``true``, in a
fresh directory each. Rounds alternate the order (off/on, on/off, ...) so a machine that
speeds up or slows down during the run does not favour one side; the figure printed per phase
is the median over the rounds and "on/off" is the ratio of those medians. The off side is the
baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

from benchlib import emit_json, load_config_compat
from mqstore import MessageBatch, MessageStore

TOPIC = "CrcBench"


def _round(root: str, crc: bool, n: int, size: int) -> dict[str, float]:
    cfg = load_config_compat({"commit_log": {"segment_bytes": 256 << 20, "record_crc": crc},
                              "plugins": {"load_entry_points": False}})
    store = MessageStore.open(root, config=cfg)
    try:
        body = b"x" * size
        batches = [MessageBatch(TOPIC, [body] * min(1000, n - i), queue_ids=0)
                   for i in range(0, n, 1000)]
        t0 = time.perf_counter()
        for batch in batches:
            store.put_batch(batch)
        store.wait_dispatched()
        put = n / (time.perf_counter() - t0)
        t0, offset, rows = time.perf_counter(), 0, 0
        while True:
            got = store.read(TOPIC, 0, offset, 1000)
            if not len(got):
                break
            rows, offset = rows + len(got), got.next_begin_offset
        read = rows / (time.perf_counter() - t0)
        t0, offset = time.perf_counter(), 0
        while offset < n:
            offset = store.get("bench", TOPIC, 0, offset, 32).next_begin_offset
        get = n / (time.perf_counter() - t0)
        if rows != n:
            raise RuntimeError(f"read {rows} of {n} messages")
    finally:
        store.close()
    return {"put_batch": put, "read": read, "get32": get}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200_000, help="messages per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per setting (median)")
    ap.add_argument("--json", action="store_true", help="also print a BENCH-JSON line")
    args = ap.parse_args()
    print(f"record CRC cost: {args.count} messages, {args.rounds} rounds, median msg/s")
    print(f"{'size':>6} {'phase':<10} {'off':>12} {'on':>12} {'on/off':>7}")
    metrics = []
    for size in (128, 1024):
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for r in range(args.rounds):
            for crc in ((False, True) if r % 2 == 0 else (True, False)):
                root = tempfile.mkdtemp(prefix="mqstore-crc-bench-")
                try:
                    runs[crc].append(_round(root, crc, args.count, size))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
        for phase in ("put_batch", "read", "get32"):
            off = statistics.median(x[phase] for x in runs[False])
            on = statistics.median(x[phase] for x in runs[True])
            print(f"{size:>5}B {phase:<10} {off:>12,.0f} {on:>12,.0f} {on / off:>7.2f}")
            metrics.append((f"{phase}_{size}_on_off", on / off, "x", "higher"))
    if args.json:
        emit_json("record_crc", metrics)


if __name__ == "__main__":
    main()
