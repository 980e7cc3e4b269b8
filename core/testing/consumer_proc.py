"""A group consumer in its own process, for tests of consumers across processes:
``python -m mqstore.testing.consumer_proc <store dir> <group> <topic> [options]``.

Opens the store read-only (beside a writer in the test process) and runs one group consumer
until told to stop (a line on stdin, or SIGTERM, which also ends a long poll) or killed. Every line it prints is
flushed at once, so the parent knows what happened before it kills this process:

    ready <member id>
    assigned <json list of queue ids>          at the start, and whenever it changes
    waiting                                    a poll went to sleep on the dispatch
                                               notification (once a poll)
    polled <queue> <first offset> <last offset> <json list of bodies' first 12 bytes>
    committed <json {queue: offset}>           after each commit returned
    bye

``ConsumerProcess`` is the parent's side: it starts this module and collects what it prints.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("group")
    ap.add_argument("topic")
    ap.add_argument("--max-msgs", type=int, default=16)
    ap.add_argument("--timeout-ms", type=float, default=100)
    ap.add_argument("--consume-from", default="first")
    ap.add_argument("--rebalance-ms", type=int, default=300)
    ap.add_argument("--no-commit", action="store_true")
    ap.add_argument("--allocation", default=None)
    args = ap.parse_args(argv[1:])

    from mqstore.config import load_config
    from mqstore.store import MessageStore
    from mqstore.runtime.workers.wakeup import Wakeup

    # SIGTERM ends a long poll at once (the futex wait returns on a signal). Anywhere else (a
    # commit, a line being written, the close) it only asks the loop to stop after it.
    state = {"polling": False, "stop": False, "asleep": False}

    def stop(_signum, _frame):
        state["stop"] = True
        if state["polling"]:
            raise Stop
    signal.signal(signal.SIGTERM, stop)

    cfg = load_config(overrides={"plugins": {"load_entry_points": False},
                                 "consumer": {"rebalance_interval_ms": args.rebalance_ms}})
    out = sys.stdout

    def say(*parts) -> None:
        out.write(" ".join(str(p) for p in parts) + "\n")
        out.flush()

    real_wait = Wakeup.wait

    def wait(wakeup, seen, timeout_s):
        if state["polling"] and not state["asleep"]:
            state["asleep"] = True
            say("waiting")  # the parent may now send what must wake this poll
        return real_wait(wakeup, seen, timeout_s)
    Wakeup.wait = wait

    with MessageStore.open(args.root, config=cfg, read_only=True) as store:
        with store.consumer(args.group, args.topic, consume_from=args.consume_from,
                            allocation=args.allocation) as consumer:
            say("ready", consumer.member_id)
            assigned = consumer.assignment
            say("assigned", json.dumps(assigned))
            while True:
                if state["stop"] or select.select([sys.stdin], [], [], 0)[0]:
                    break  # SIGTERM, a line, or stdin closed
                try:
                    state["polling"], state["asleep"] = True, False
                    polled = consumer.poll(args.max_msgs, args.timeout_ms)
                except Stop:
                    break
                finally:
                    state["polling"] = False
                if consumer.assignment != assigned:
                    assigned = consumer.assignment
                    say("assigned", json.dumps(assigned))
                for q, batch in polled.batches:
                    bodies = [batch.bodies[batch.body_offsets[i]:batch.body_offsets[i + 1]]
                              .tobytes()[:12].decode() for i in range(len(batch))]
                    say("polled", q, int(batch.queue_offsets[0]), int(batch.queue_offsets[-1]),
                        json.dumps(bodies))
                if not args.no_commit:
                    done = consumer.commit()
                    if done:
                        say("committed", json.dumps(done))
            consumer.close(commit=not args.no_commit)
    say("bye")
    return 0


class Stop(Exception):
    pass


class ConsumerProcess:
    """The parent's side: starts this script and collects what it prints."""

    def __init__(self, root, group: str, topic: str, *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore.testing.consumer_proc", str(root), group, topic,
             *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[str, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            self.lines.append((kind, rest))

    def wait_for(self, predicate, timeout: float = 30.0) -> bool:
        """Whether ``predicate(self)`` came true within ``patience(timeout)`` (or before the
        process ended)."""
        from mqstore.testing import patience  # here: the consumer process runs this module

        deadline = time.monotonic() + patience(timeout)
        while not predicate(self):
            if time.monotonic() > deadline or self.proc.poll() is not None and not predicate(self):
                return predicate(self)
            time.sleep(0.01)
        return True

    def asleep(self) -> bool:
        """Whether its last line says a poll is asleep on the dispatch notification."""
        return bool(self.lines) and self.lines[-1][0] == "waiting"

    def naps(self) -> int:
        """How many of its polls went to sleep on the notification: with ``--timeout-ms T``
        each of them lasted T (unless woken), a measure of its time that a loaded machine
        stretches as it stretches the consumer's own."""
        return sum(1 for kind, _rest in list(self.lines) if kind == "waiting")

    @property
    def assignment(self) -> list[int] | None:
        got = [json.loads(rest) for kind, rest in list(self.lines) if kind == "assigned"]
        return got[-1] if got else None

    def polled(self) -> list[tuple[int, int, int, list[str]]]:
        out = []
        for kind, rest in list(self.lines):
            if kind == "polled":
                q, first, last, bodies = rest.split(" ", 3)
                out.append((int(q), int(first), int(last), json.loads(bodies)))
        return out

    def committed(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for kind, rest in list(self.lines):
            if kind == "committed":
                out.update({int(q): off for q, off in json.loads(rest).items()})
        return out

    def stop(self, timeout: float = 30.0) -> int:
        """Ask it to stop (between polls, or at once in a long poll): it commits and closes."""
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(5)

    def errors(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
