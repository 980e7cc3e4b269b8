"""Pops from several processes at once (issue 26): four read-only stores and the writer pop the
same group with nothing handed out twice while it is invisible; and poppers killed with
SIGKILL in the middle of their pops and acks lose nothing: every message not acknowledged
comes back after its invisible time, and none whose ack returned does."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from mqstore.testing import fill, wait_for

TOPIC = "T"
QUEUES = 4
INVISIBLE_MS = 600_000

_POPPER = """
import random, sys, time
from mqstore import MessageStore, load_config
from mqstore.clock import _attach_clock
root, clock, acks, seed = sys.argv[1], sys.argv[2], sys.argv[3] == "ack", int(sys.argv[4])
store = MessageStore.open(root, read_only=True, clock=_attach_clock(clock),
                          config=load_config(overrides={"plugins": {"load_entry_points": False}}))
rng = random.Random(seed)
print("ready", flush=True)
sys.stdin.readline()
idle, first = 0, True
while idle < 3:
    got = store.pop("g", "T", rng.randint(1, 8), %d, consume_from="first")
    idle = 0 if got else idle + 1
    time.sleep(0.002)  # as a consumer handles what it got: the others get turns between pops
    if got:
        print("\\n".join(f"popped {m.queue_id} {m.queue_offset} {m.delivery_attempt}"
                        for m in got), flush=True)
    if got and first:  # the test may hold each popper after its first pop that got some
        print("first", flush=True)
        sys.stdin.readline()
        first = False
    if acks and got:
        chosen = [m for m in got if rng.random() < 0.7]
        if chosen:
            print("\\n".join(f"acking {m.queue_id} {m.queue_offset}" for m in chosen), flush=True)
            if rng.random() < 0.5:
                assert store.ack([m.receipt_handle for m in chosen]) == [None] * len(chosen)
            else:
                for m in chosen:
                    store.ack(m.receipt_handle)
            print("\\n".join(f"acked {m.queue_id} {m.queue_offset}" for m in chosen), flush=True)
print("idle", flush=True)
store.close()
""" % INVISIBLE_MS


class Popper:
    """A popping process whose output lines are gathered as they come."""

    def __init__(self, root, clock, acks: bool, seed: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _POPPER, str(root), clock._shm.name,
             "ack" if acks else "hold", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[list[str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.split())

    def ready(self) -> None:
        """Wait until it opened the store."""
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr.read()
        self._reader.start()

    def go(self, hold: bool = False) -> None:
        """Let it pop; with ``hold`` it waits after its first pop that got some, until
        ``release``."""
        self.proc.stdin.write("go\n" if hold else "go\ngo\n")
        self.proc.stdin.flush()

    def release(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def first_done(self) -> bool:
        return ["first"] in self.lines or self.proc.poll() is not None

    def finish(self, kill: bool) -> str:
        if kill:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)
        self._reader.join(60)
        err = self.proc.stderr.read()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return err

    def seen(self, kind: str) -> list[tuple[int, int]]:
        return [(int(w[1]), int(w[2])) for w in list(self.lines) if w[0] == kind]


def _fill(store, count: int) -> set[tuple[int, int]]:
    return {(a.queue_id, a.queue_offset)
            for a in fill(store, count, topic=TOPIC, queues=QUEUES, batch=100)}


@pytest.mark.slow
def test_four_processes_and_the_writer_never_hand_out_a_message_twice(make_store, store_dir,
                                                                      manual_clock):
    store = make_store()
    everything = _fill(store, 400)
    poppers = [Popper(store_dir, manual_clock, acks=False, seed=i) for i in range(4)]
    mine: list[tuple[int, int]] = []
    for p in poppers:
        p.ready()
    for p in poppers:  # all at once, once every one has opened its store
        p.go(hold=True)
    # Each popper pops once before the writer starts its own loop: on a loaded machine a
    # popper starting late would otherwise find nothing left.
    wait_for(lambda: all(p.first_done() for p in poppers), 60, what="every popper's first pop")
    for p in poppers:
        p.release()
    while any(p.proc.poll() is None for p in poppers):
        mine += [(m.queue_id, m.queue_offset)
                 for m in store.pop("g", TOPIC, 5, INVISIBLE_MS, consume_from="first")]
    errors = [p.finish(kill=False) for p in poppers]
    assert all(p.proc.returncode == 0 for p in poppers), errors
    mine += [(m.queue_id, m.queue_offset) for m in store.pop("g", TOPIC, 1000, INVISIBLE_MS)]
    theirs = [pair for p in poppers for pair in p.seen("popped")]
    handed_out = mine + theirs
    assert len(handed_out) == len(set(handed_out)), "a message was handed out twice"
    assert set(handed_out) == everything
    assert all(p.seen("popped") for p in poppers)  # they did pop side by side


@pytest.mark.slow
def test_poppers_killed_mid_pop_and_mid_ack_lose_nothing(make_store, store_dir, manual_clock):
    store = make_store()
    everything = _fill(store, 1000)
    rng = random.Random(7)
    popped: list[tuple[int, int]] = []
    acking: set[tuple[int, int]] = set()
    acked: set[tuple[int, int]] = set()
    for round_ in range(2):
        poppers = [Popper(store_dir, manual_clock, acks=True, seed=10 * round_ + i)
                   for i in range(4)]
        for p in poppers:
            p.ready()
        for p in poppers:
            p.go()
        for p in rng.sample(poppers, len(poppers)):
            time.sleep(rng.uniform(0.05, 0.4))
            err = p.finish(kill=True)
            assert p.proc.returncode in (-signal.SIGKILL, 0), err
            assert "Traceback" not in err, err
            popped += p.seen("popped")
            acking |= set(p.seen("acking"))
            acked |= set(p.seen("acked"))
    # Nothing was handed out twice while invisible, killed processes or not.
    assert len(popped) == len(set(popped))
    assert acked and popped
    # The invisible time runs out: everything not acknowledged comes back (and what was
    # never popped comes for the first time); nothing whose ack returned comes back.
    manual_clock.advance(INVISIBLE_MS)
    drained: list[tuple[int, int]] = []
    while True:
        got = store.pop("g", TOPIC, 64, INVISIBLE_MS)
        if not got:
            break
        drained += [(m.queue_id, m.queue_offset) for m in got]
        assert store.ack([m.receipt_handle for m in got]) == [None] * len(got)
    assert len(drained) == len(set(drained))
    assert not set(drained) & acked, "an acknowledged message was delivered again"
    # An ack cut short by the kill either counted or not: those may come back or not.
    assert everything - set(drained) - acked <= acking - acked
    assert set(drained) >= everything - set(popped) - acking
    manual_clock.advance(INVISIBLE_MS)
    assert store.pop("g", TOPIC, 64, INVISIBLE_MS) == []
