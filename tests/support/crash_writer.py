"""Writer process for the SIGKILL tests:
``python crash_writer.py <dir> <sync|async> <seed> [mmap|transient_pool]``.

Opens a store with 64 KiB commit-log segments and puts messages with bodies derived from
``(index, seed)`` to several queues of topic ``T``, one at a time. After each acknowledged put
it prints ``<index> <queue_id> <queue_offset> <phys_offset>`` and flushes stdout, so the parent
knows exactly what was acknowledged before it kills this process. The store is never closed:
the process only ends by a signal, by a failed put (exit 3), or when the parent goes away.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

SEGMENT_BYTES = 64 * 1024
QUEUES = 4
TOPIC = "T"
MAX_MESSAGES = 20_000
BORN_TIMESTAMP = 1_700_000_000_000


def body_for(index: int, seed: int) -> bytes:
    """Deterministic body of message ``index``: its index, then 0..~300 derived bytes."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return b"%08d:" % index + digest * (digest[0] % 10)


def queue_for(index: int, seed: int) -> int:
    return random.Random(seed * 1_000_003 + index).randrange(QUEUES)


def tags_for(index: int) -> str | None:
    return None if index % 3 == 0 else f"tag{index % 3}"


def index_of(body: bytes) -> int:
    return int(body[:8])


def config_overrides(flush_mode: str, writer: str = "mmap") -> dict:
    return {
        "commit_log": {"segment_bytes": SEGMENT_BYTES},
        "store": {"hash": "java"},
        "flush": {"policy": flush_mode},
        "writer": {"kind": writer},
        "plugins": {"load_entry_points": False},
    }


def main(argv: list[str]) -> int:
    root, flush_mode, seed = argv[1], argv[2], int(argv[3])
    writer = argv[4] if len(argv) > 4 else "mmap"
    from mqstore import Message, MessageStore, PutStatus, load_config

    store = MessageStore.open(root, config=load_config(
        overrides=config_overrides(flush_mode, writer)))
    out = sys.stdout
    for index in range(MAX_MESSAGES):
        result = store.put(Message(TOPIC, body_for(index, seed), tags=tags_for(index),
                                   queue_id=queue_for(index, seed),
                                   born_timestamp=BORN_TIMESTAMP))
        if result.status is not PutStatus.PUT_OK:
            print(f"put {index} failed: {result}", file=sys.stderr, flush=True)
            os._exit(3)
        out.write(f"{index} {result.queue_id} {result.queue_offset} {result.phys_offset}\n")
        out.flush()
    sys.stdin.read()  # wait for the kill; EOF means the parent is gone
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
