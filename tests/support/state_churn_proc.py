"""State changes from another process, for the state mirror's tests:
``python state_churn_proc.py <root> <topic> <stop file>``.

Opens the store in ``root`` read-only (beside the writer, as ``mqstore consume`` does) and,
until the stop file exists, pops (group ``churn-pop``, 8 at a time, 60 s invisible) and acks
every other message, and polls and commits as group ``churn-commit``. After each round it
prints ``round <n> popped <k> acked <k> committed <k>``; at the stop, ``stopped``. Each line
is flushed at once, so a test that SIGKILLs it knows what was done.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> int:
    from mqstore import MessageStore, load_config

    root, topic, stop_file = argv[1], argv[2], argv[3]
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    store = MessageStore.open(root, config=config, read_only=True)
    n = 0
    with store.consumer("churn-commit", topic, consume_from="first") as consumer:
        while not os.path.exists(stop_file):
            popped = store.pop("churn-pop", topic, max_msgs=8, invisible_ms=60_000,
                               consume_from="first")
            acked = store.ack([p.receipt_handle for p in popped[::2]])
            polled = consumer.poll(8)
            committed = consumer.commit()
            n += 1
            print(f"round {n} popped {len(popped)} acked {len(acked)} committed "
                  f"{len(committed)}", flush=True)
            if not popped and not polled:
                time.sleep(0.05)
    store.close()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
