"""Descriptors of the pop state: a process keeps at most ``consumer.max_open_pop_states`` topic
and group states open (journal and lock: two descriptors each), however many groups pop; a
state let go is reopened and reloaded from the files when next used, so nothing a group did is
lost or done twice, and another process's changes meanwhile are seen; running out of
descriptors sheds the idle states and the call goes through."""

from __future__ import annotations

import errno
import os

from mqstore.consumer import pop_journal
from mqstore.consumer.pop_state import POP_DIR
from mqstore.testing import fill

TOPIC = "T"


def pop_descriptors(root) -> int:
    """Descriptors of this process open on files of the pop state."""
    folder = os.path.join(str(root), POP_DIR) + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(folder):
                count += 1
        except OSError:  # closed since the listing
            pass
    return count


def test_open_pop_states_are_bounded_and_every_group_still_works(make_store, manual_clock):
    store = make_store({"consumer": {"max_open_pop_states": 4}})
    fill(store, 8, topic=TOPIC, queues=2)
    held = {}
    for i in range(40):
        held[f"g{i}"] = store.pop(f"g{i}", TOPIC, 3, 60_000, consume_from="first")
        assert pop_descriptors(store.root) <= 2 * 4
    assert all(len(popped) == 3 for popped in held.values())
    # Every group's state was let go and is reloaded: its handles are good, its deliveries
    # in flight stay in flight, and what it acknowledged is never delivered again.
    for group, popped in held.items():
        assert store.ack([m.receipt_handle for m in popped[:2]]) == [None, None], group
        assert store.pop(group, TOPIC, 8, 60_000) != []  # the five never popped
        assert pop_descriptors(store.root) <= 2 * 4
    manual_clock.advance(60_000)
    for group, popped in held.items():
        again = store.pop(group, TOPIC, 8, 60_000)
        # The third of the first pop and the five after it came back; the two acked did not.
        assert len(again) == 6, group
        assert popped[2].queue_offset in {m.queue_offset for m in again
                                          if m.queue_id == popped[2].queue_id}
        assert {(m.queue_id, m.queue_offset) for m in popped[:2]}.isdisjoint(
            (m.queue_id, m.queue_offset) for m in again)


def test_a_released_state_sees_what_another_process_did(make_store, store_dir, manual_clock):
    """The state let go is reloaded from the files, checking the journal it then opens: a
    reader process acknowledged and compacted meanwhile (a new journal, a new inode)."""
    store = make_store({"consumer": {"max_open_pop_states": 1}})
    fill(store, 4, topic=TOPIC, queues=1)
    first = store.pop("g", TOPIC, 2, 60_000, consume_from="first")
    store.pop("other", TOPIC, 1, 60_000, consume_from="first")  # "g" is let go
    with make_store(read_only=True) as reader:
        assert reader.ack([m.receipt_handle for m in first]) == [None, None]
    # The reader's close compacted: the journal "g" had open is gone.
    manual_clock.advance(60_000)
    rest = store.pop("g", TOPIC, 4, 60_000)
    assert [m.queue_offset for m in rest] == [2, 3]


def test_out_of_descriptors_sheds_the_idle_states_and_goes_through(make_store, monkeypatch):
    store = make_store({"consumer": {"max_open_pop_states": 64}})
    fill(store, 4, topic=TOPIC, queues=1)
    for i in range(10):
        store.pop(f"g{i}", TOPIC, 1, 60_000, consume_from="first")
    assert pop_descriptors(store.root) == 2 * 10
    opened = pop_journal.PopJournal._lock
    failures = []

    def lock(self):
        if not failures:
            failures.append(self.path)
            raise OSError(errno.EMFILE, "Too many open files")
        return opened(self)

    monkeypatch.setattr(pop_journal.PopJournal, "_lock", lock)
    got = store.pop("fresh", TOPIC, 2, 60_000, consume_from="first")
    assert [m.queue_offset for m in got] == [0, 1] and len(failures) == 1
    assert pop_descriptors(store.root) == 2  # the others were let go; "fresh" is open
    assert store.ack(got[0].receipt_handle) is None
