"""Test helpers shipped with mqstore, for its own tests and for plugin authors.

``simulate_crash`` stops a store the way a killed process would (no final flush bookkeeping,
the abort marker stays, the lock goes with the process); ``StoreStateMachine`` is a hypothesis
state machine that checks any store configuration against a plain list model, including
reopen and crash/recover steps. Use it by subclassing and setting ``overrides``.
``StoreFactory``, ``open_store`` and ``fill`` (``mqstore.testing.stores``) open stores with small
test defaults and fill them; ``wait_until`` and ``wait_for`` wait on what another process does,
for up to a bound that ``patience`` stretches on a loaded machine.
``ManualClock`` is a settable store clock that stays one clock in the processes it is pickled to;
``ManualScheduler`` is the loops' interval clock, moved by hand, with which a test runs a periodic
job (``run("cleanup")``) instead of sleeping until it comes round.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from mqstore.clock import CLOCK_SEGMENT_PREFIX, ManualClock  # noqa: F401 - part of the API
from mqstore.scheduler import (  # noqa: F401 - part of the API
    JOBS, SCHEDULER_SEGMENT_PREFIX, ManualScheduler, attach_scheduler,
)
from mqstore.config import load_config
from mqstore.message import GetStatus, Message, PutStatus
from mqstore.store import MessageStore
from mqstore.testing.stores import (  # noqa: F401 - part of the API
    STORE_HOST, StoreFactory, fill, merged, numbered, open_store, suite_defaults,
)


def simulate_crash(store: MessageStore) -> None:
    """End ``store`` abruptly: loops stop without a final flush, files close, ``abort`` stays
    behind, the lock goes as with the process."""
    store._crash()


PATIENCE_CAP = 8.0  # the most a bound is stretched


def patience(seconds: float) -> float:
    """``seconds``, how long a wait may take on a quiet machine, stretched by how loaded the
    machine is now (its 1-minute load average per CPU, 1 to ``PATIENCE_CAP`` times): a test run
    beside other work, or beside itself under pytest-xdist, waits longer for another process
    instead of failing. Only for bounds on waits that end as soon as their condition holds."""
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        per_cpu = 1.0
    return seconds * min(PATIENCE_CAP, max(1.0, per_cpu))


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Whether ``predicate()`` became true within ``patience(timeout)`` seconds (checked every
    ``interval``): for what another process or a background loop does in its own time."""
    deadline = time.monotonic() + patience(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def wait_for(probe, timeout: float = 30.0, interval: float = 0.02, what: str | None = None):
    """``probe()``'s first truthy answer, asked every ``interval`` seconds for up to
    ``patience(timeout)``; else AssertionError naming ``what`` (default: the probe) and the last
    answer. For what another process or thread does in its own time; a periodic job of the
    store's loops is run with a ``ManualScheduler`` instead."""
    bound = patience(timeout)
    deadline = time.monotonic() + bound
    while True:
        answer = probe()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or getattr(probe, '__name__', probe)} not reached "
                                 f"within {bound:.3g} s; last: {answer!r}")
        time.sleep(interval)


def read_queue(store: MessageStore, topic: str, queue_id: int, expression: str | None = None):
    """Every message of one queue, pulled 32 at a time from its min offset."""
    out = []
    offset = store.min_offset(topic, queue_id)
    while True:
        res = store.get("mqstore-testing", topic, queue_id, offset, 32, expression=expression)
        if res.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            return out
        out.extend(res.messages)
        offset = res.next_begin_offset


def __getattr__(name: str):
    if name == "StoreStateMachine":
        machine = globals()["StoreStateMachine"] = _state_machine()
        return machine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _state_machine():
    """``StoreStateMachine``, made when first asked for: hypothesis (a test dependency only;
    None without it) is imported then, not by every process that imports this package (the
    fault writer and the consumer process start many times in a test run)."""
    try:
        from hypothesis import strategies as st
        from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
    except ImportError:
        return None
    TOPICS = ("A", "B")
    TAGS = (None, "t1", "t2")
    _message = st.builds(
        Message, topic=st.sampled_from(TOPICS), body=st.binary(max_size=300),
        tags=st.sampled_from(TAGS), queue_id=st.integers(0, 2),
    )

    class StoreStateMachine(RuleBasedStateMachine):
        """The store must always hold exactly what the model holds, in the same order."""

        overrides: dict = {"commit_log": {"segment_bytes": 4096},
                           "consume_queue": {"file_units": 8},
                           "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"},
                           "plugins": {"load_entry_points": False}}

        def __init__(self) -> None:
            super().__init__()
            self.root = tempfile.mkdtemp(prefix="mqstore-sm-")
            self.config = load_config(overrides=self.overrides)
            self.store = MessageStore.open(self.root, config=self.config)
            self.model: dict[tuple[str, int], list[tuple[bytes, str | None]]] = {}

        def _record(self, msg: Message, queue_offset: int) -> None:
            queue = self.model.setdefault((msg.topic, msg.queue_id), [])
            assert queue_offset == len(queue)
            queue.append((msg.body, msg.tags))

        @rule(msg=_message)
        def put(self, msg):
            r = self.store.put(msg)
            assert r.status is PutStatus.PUT_OK, r
            self._record(msg, r.queue_offset)

        @rule(msgs=st.lists(_message, min_size=1, max_size=12))
        def put_batch(self, msgs):
            res = self.store.put_batch(msgs)
            assert res.status is PutStatus.PUT_OK, res.error
            for msg, q in zip(msgs, res.queue_offsets.tolist()):
                self._record(msg, q)

        @rule()
        def reopen(self):
            self.store.close()
            self.store = MessageStore.open(self.root, config=self.config)
            assert not self.store.recovery_report.abnormal
            assert self.store.recovery_report.clean

        @rule()
        def crash_and_recover(self):
            self.store.wait_dispatched()
            simulate_crash(self.store)
            self.store = MessageStore.open(self.root, config=self.config)
            assert self.store.recovery_report.abnormal
            assert self.store.recovery_report.truncated_bytes == 0

        @rule(tag=st.sampled_from(TAGS[1:]))
        def filtered_pull_matches_model(self, tag):
            self.store.wait_dispatched()
            for (topic, qid), queue in self.model.items():
                got = [m.body for m in read_queue(self.store, topic, qid, expression=tag)]
                assert got == [body for body, t in queue if t == tag]

        @invariant()
        def queues_match_model(self):
            self.store.wait_dispatched()
            assert sorted(self.store.topics()) == sorted({t for t, _q in self.model})
            for (topic, qid), queue in self.model.items():
                assert self.store.max_offset(topic, qid) == len(queue)
                msgs = read_queue(self.store, topic, qid)
                assert [m.queue_offset for m in msgs] == list(range(len(queue)))
                assert [(m.body, m.tags) for m in msgs] == queue

        def teardown(self):
            self.store.close()
            shutil.rmtree(self.root, ignore_errors=True)

    StoreStateMachine.__qualname__ = "StoreStateMachine"  # as if made at the top level
    return StoreStateMachine
