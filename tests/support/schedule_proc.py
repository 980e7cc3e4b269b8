"""A writer process whose schedule delivers delayed messages, for kill tests: it opens the
store on the test's shared clock (default configuration: worker processes), puts COUNT
messages with delay levels 1..3 (KIND ``levels``) or delivery times 1, 5 and 10 s ahead
(``timers``) unless the store has them already, says ``ready`` with the schedule's status,
then prints the status once per line it reads on stdin; EOF closes it.

    schedule_proc.py ROOT CLOCK_NAME COUNT OVERRIDES_JSON KIND
"""

from __future__ import annotations

import json
import sys

from mqstore import Message
from mqstore.clock import _attach_clock
from mqstore.testing import merged, open_store, suite_defaults

TOPIC = "D"
TIMER_TOPIC = "rmq_sys_wheel_timer"
DELAYS_MS = {1: 1_000, 2: 5_000, 3: 10_000}


def main() -> None:
    root, clock, count, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    timers = sys.argv[5] == "timers"
    clock = _attach_clock(clock)
    store = open_store(root, merged(suite_defaults(), json.loads(overrides)), clock=clock)
    if store.max_offset("SCHEDULE_TOPIC_XXXX", 0) + store.max_offset(TIMER_TOPIC, 0) == 0:
        for i in range(count):
            level = 1 + i % 3
            props = ({"TIMER_DELIVER_MS": str(clock() + DELAYS_MS[level])} if timers
                     else {"DELAY": str(level)})
            r = store.put(Message(TOPIC, b"m%d" % i, keys=[f"k{i}"], queue_id=i % 2,
                                  properties=props))
            assert r.status.value == "PUT_OK", r
    print("ready", json.dumps(store.schedule_status()), flush=True)
    for _line in sys.stdin:
        print(json.dumps(store.schedule_status()), flush=True)
    store.close()


if __name__ == "__main__":
    main()
