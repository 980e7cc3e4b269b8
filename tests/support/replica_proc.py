"""A store process for the replication tests: ``python replica_proc.py <root> <config.yaml>``.

Opens the store (its role and addresses from the YAML, worker processes as configured),
starts its replication and prints ``READY <address>`` (a master's bound ``server.ha_listen``,
else ``-``). Then it follows commands on stdin, one per line, answering on stdout (flushed
after every line, so the parent knows what was answered before it kills this process):

    put N BYTES     N single puts to topic ``orders`` (queue i % 4, key ``k<seq>``), one line
                    each: ``<status> <phys offset> <size>``, then ``DONE``
    batch N BYTES   one put_batch of N messages: ``DONE <status> <end offset>``
    stream BYTES MS put batches of 20 in a background thread, MS ms apart, until ``halt``
    halt            stop streaming: ``HALTED <end offset>``
    end             wait until dispatched: ``END <end offset>``
    close           close the store and exit 0
"""

from __future__ import annotations

import logging
import sys
import threading
import time

TOPIC = "orders"


def body(seq: int, size: int) -> bytes:
    return (b"%010d|" % seq + bytes(range(256)) * (size // 256 + 1))[:max(size, 11)]


def main(argv: list[str]) -> int:
    root, config_path = argv[1], argv[2]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mqstore import Message, MessageBatch, MessageStore, load_config

    store = MessageStore.open(root, config=load_config(config_path))
    store.replication.start()
    out = sys.stdout
    seq = [0]
    lock = threading.Lock()
    streaming = threading.Event()
    streamer: list[threading.Thread] = []

    def say(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    def next_seqs(n: int) -> range:
        with lock:
            first = seq[0]
            seq[0] += n
        return range(first, first + n)

    def batch(n: int, size: int):
        seqs = next_seqs(n)
        return store.put_batch(MessageBatch(
            topic=TOPIC, bodies=[body(i, size) for i in seqs],
            queue_ids=[i % 4 for i in seqs], keys=[["k%d" % i] for i in seqs]))

    def stream(size: int, pause_s: float) -> None:
        while streaming.is_set():
            batch(20, size)
            time.sleep(pause_s)

    say(f"READY {store.replication.address or '-'}")
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "put":
            n, size = int(args[0]), int(args[1])
            for i in next_seqs(n):
                r = store.put(Message(TOPIC, body(i, size), queue_id=i % 4, keys=["k%d" % i]))
                say(f"{r.status.value} {r.phys_offset} {r.size}")
            say("DONE")
        elif cmd == "batch":
            r = batch(int(args[0]), int(args[1]))
            say(f"DONE {r.status.value} {store.max_phys_offset}")
        elif cmd == "stream":
            streaming.set()
            streamer.append(threading.Thread(target=stream,
                                             args=(int(args[0]), int(args[1]) / 1000.0)))
            streamer[-1].start()
        elif cmd == "halt":
            streaming.clear()
            for thread in streamer:
                thread.join()
            say(f"HALTED {store.max_phys_offset}")
        elif cmd == "end":
            store.wait_dispatched(30.0)
            say(f"END {store.max_phys_offset}")
        elif cmd == "close":
            break
    streaming.clear()
    for thread in streamer:
        thread.join()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
