"""One coordination node in its own process, for the tests that stop or kill it:
``python coordination_proc.py '<json>'`` with the json holding the settings
(``CoordinationSettings`` fields) and ``offset``.

It starts a ``Coordinator`` and prints one JSON line per event on stdout (flushed each time):
``{"event": "elected", "epoch": n}``, ``{"event": "fenced", "reason": ...}``, and from its
main thread, which checks ``may_write()`` every few milliseconds as a put path would,
``{"event": "may_write", "value": ...}`` at every change and ``{"event": "resumed",
"may_write": ...}`` with the first answer after a gap in its own clock of more than half a
second (the process was stopped, then continued). ``{"event": "ready"}`` once started.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from mqstore.coordination import Coordinator, CoordinationSettings, now

_lock = threading.Lock()


def say(**event) -> None:
    with _lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    offset = args.pop("offset", 0)
    args["endpoints"] = tuple(args["endpoints"])
    coordinator = Coordinator(
        CoordinationSettings(**args), role="master", offset=offset,
        on_elected=lambda epoch: say(event="elected", epoch=epoch),
        on_fenced=lambda reason: say(event="fenced", reason=reason))
    coordinator.start()
    say(event="ready")
    last, seen = now(), None
    while True:
        t = now()
        writable = coordinator.may_write()  # after the clock read: a gap seen is a fresh answer
        if t - last > 0.5:
            say(event="resumed", may_write=writable)
        if writable != seen:
            say(event="may_write", value=writable)
            seen = writable
        last = t
        time.sleep(0.005)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
