"""A writer process for fault tests: ``python -m mqstore.testing.fault_writer SPEC_JSON``.

It opens a store (worker processes by default) and puts deterministic messages (bodies derived
from ``(seed, index)``, see ``mqstore.testing.faults``) one at a time or in batches. After
every answer it prints one line and flushes stdout, so the parent knows exactly what was
acknowledged when a fault strikes:

    ack <index> <queue_id> <queue_offset> <phys_offset>     PUT_OK
    refused <index> <STATUS> <reason>                       anything else; nothing was stored
    interrupted <index>                                     a KeyboardInterrupt; sent again
    status <json>                                           worker status at the end
    done <acked> <refused>                                  the run is over (then: close or wait)

SPEC keys: ``root``, ``overrides`` (config), ``seed``, ``count`` (messages to try), ``batch``
(0: ``put``; n: ``put_batch`` of n), ``stop_after_refusals`` (consecutive refusals that end the
run), ``then`` (``"close"``, ``"wait"``: block until stdin closes, the store left open, or
``"exit"``: leave without closing), ``pace_ms`` (pause between puts), ``wait_s`` (how long the
final ``wait_dispatched`` may take; default 30), ``sigint_after_writes`` (with the
``*_ctrl_c`` writers of ``mqstore.testing.faults``: the record-block writes after which the
writer sends SIGINT to its process group), ``stop_on_eof`` (also end the run once stdin
closes: a writer that puts until the parent says stop), ``scheduler`` (the name of the parent's
``ManualScheduler``: the store's loops run their periodic jobs when the parent says so).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from mqstore.testing.faults import SIGINT_AFTER_WRITES_ENV, message_for


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    os.environ[SIGINT_AFTER_WRITES_ENV] = ",".join(map(str, spec.get("sigint_after_writes", ())))
    from mqstore.config import load_config
    from mqstore.message import PutStatus
    from mqstore.store import MessageStore
    from mqstore.scheduler import attach_scheduler

    scheduler = attach_scheduler(spec["scheduler"]) if spec.get("scheduler") else None
    store = MessageStore.open(spec["root"], config=load_config(overrides=spec["overrides"]),
                              scheduler=scheduler)
    if spec.get("late_handler"):
        # A program's own Ctrl-C handler, set once the store is open (as a graceful-shutdown
        # handler usually is): the store must still finish a put before it runs.
        signal.signal(signal.SIGINT, _own_ctrl_c)
    seed, batch = spec["seed"], spec.get("batch", 0)
    count, limit = spec["count"], spec.get("stop_after_refusals", 1 << 62)
    pace_s = spec.get("pace_ms", 0) / 1000.0
    out = sys.stdout
    acked = refused = streak = interrupted = 0
    index = 0
    stop = threading.Event()
    if spec.get("stop_on_eof"):
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while index < count and streak < limit and not stop.is_set():
        n = max(1, batch)
        try:
            # Built inside the try: a Ctrl-C while the messages are made is retried as well.
            msgs = [message_for(seed, i) for i in range(index, min(count, index + n))]
            answers = _put(store, msgs, batch, PutStatus)
            lines = []
            for i, answer in enumerate(answers, start=index):
                if answer[0] is PutStatus.PUT_OK:
                    lines.append("ack %d %d %d %d\n" % (i, *answer[1:]))
                else:
                    reason = " ".join(str(answer[1]).split())
                    lines.append(f"refused {i} {answer[0].name} {reason}\n")
            out.write("".join(lines))
            out.flush()
        except KeyboardInterrupt:
            # As a REPL or a long-running program that handles Ctrl-C and goes on: whether
            # these messages were stored is unknown, so they are sent again (a producer's
            # retry); the audit counts acknowledged ones only.
            interrupted += 1
            out.write(f"interrupted {index}\n")
            out.flush()
            continue
        for answer in answers:
            if answer[0] is PutStatus.PUT_OK:
                acked += 1
                streak = 0
            else:
                refused += 1
                streak += 1
        if streak == 0:
            index += len(msgs)
        if pace_s:
            time.sleep(pace_s)
    status = {"dispatch": store.worker_status(), "flush": store.internals.flush_client.status(),
              "interrupted": interrupted}
    try:
        store.wait_dispatched(timeout=spec.get("wait_s", 30.0))
    except Exception as exc:  # reported, not raised: the parent asserts on it
        status["wait_dispatched"] = f"{type(exc).__name__}: {exc}"
    out.write(f"status {json.dumps(status, default=str)}\n")
    out.write(f"done {acked} {refused}\n")
    out.flush()
    then = spec.get("then", "close")
    if then == "close":
        try:
            store.close()
        except KeyboardInterrupt:
            # A Ctrl-C that lands in the close (the parent may signal late on a loaded
            # machine) is raised once the store is closed: answered like one during a put.
            out.write("interrupted -1\n")
            out.flush()
    elif then == "wait":
        sys.stdin.read()
    os._exit(0)


def _own_ctrl_c(_signum, _frame) -> None:
    raise KeyboardInterrupt("the program's own handler")


def _put(store, msgs, batch: int, PutStatus) -> list[tuple]:
    if batch:
        res = store.put_batch(msgs)
        if res.status is not PutStatus.PUT_OK:
            return [(res.status, res.error)] * len(msgs)
        return [(PutStatus.PUT_OK, q, o, p) for q, o, p in zip(
            res.queue_ids.tolist(), res.queue_offsets.tolist(), res.phys_offsets.tolist())]
    r = store.put(msgs[0])
    if r.status is PutStatus.PUT_OK:
        return [(r.status, r.queue_id, r.queue_offset, r.phys_offset)]
    return [(r.status, r.error)]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
