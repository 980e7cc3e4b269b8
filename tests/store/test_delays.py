"""Delayed messages through the embedding API (docs/delays.md): a put with ``DELAY`` is kept
in ``SCHEDULE_TOPIC_XXXX``, one with a delivery time in ``rmq_sys_wheel_timer``, and each is
delivered to its topic once due by the store clock, with the loops in worker processes as the
default configuration runs them; a RocketMQ 4.9.8 broker's store continues its schedule."""

from __future__ import annotations

import json
import tarfile

from mqstore import Message
from mqstore.format.delay_offsets import decode
from mqstore.message import PutStatus
from mqstore.testing import wait_for

SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def _tick_past(store, ticks: int | None = None) -> dict:
    """The schedule's status once it ran a whole tick after this call, recovered (it reports
    nothing pending before) and with every put so far dispatched (it counts pending messages
    in the schedule topic's queues)."""
    store.wait_dispatched()
    seen = store.schedule_status()["ticks"] if ticks is None else ticks
    return wait_for(lambda: (s := store.schedule_status())["ticks"] > seen + 1
                    and s["running"] and s, what="a schedule tick")


def test_a_delayed_put_is_kept_in_the_schedule_topic_with_its_real_topic(make_store,
                                                                         manual_clock):
    store = make_store()
    r = store.put(Message("T", b"later", tags="A", keys=["k1"],
                          properties={"DELAY": "3", "p": "v"}, queue_id=1))
    # RocketMQ's answer: the real queue, the offset in the schedule queue.
    assert (r.status, r.queue_id, r.queue_offset) == (PutStatus.PUT_OK, 1, 0)
    m = store.message_at(r.phys_offset)
    assert (m.topic, m.queue_id, m.queue_offset, m.sysflag) == (SCHEDULE, 2, 0, 0)
    assert m.properties_text == ("TAGS\x01A\x02KEYS\x01k1\x02DELAY\x013\x02p\x01v\x02"
                                 "REAL_TOPIC\x01T\x02REAL_QID\x011\x02")
    capped = store.put(Message("T", b"much later", properties={"DELAY": "99"}, queue_id=0))
    c = store.message_at(capped.phys_offset)
    assert (c.topic, c.queue_id, c.properties["DELAY"]) == (SCHEDULE, 17, "18")
    store.wait_dispatched()
    assert store.read(SCHEDULE, 2, 0).tags_codes.tolist() == [m.store_timestamp + 10_000]
    assert store.read(SCHEDULE, 17, 0).tags_codes.tolist() == [c.store_timestamp + 7_200_000]
    assert store.max_offset("T", 1) == 0  # nothing in the real topic yet


def test_delivered_at_its_time_never_before_and_once(make_store, manual_clock):
    store = make_store()
    sent = store.put(Message("T", b"later", tags="A", properties={"DELAY": "2"}, queue_id=3))
    source = store.message_at(sent.phys_offset)
    due = source.store_timestamp + 5_000
    manual_clock.now = due - 1
    status = _tick_past(store)
    assert store.max_offset("T", 3) == 0 and status["pending"] == {2: 1}
    manual_clock.now = due
    wait_for(lambda: store.max_offset("T", 3) == 1, what="the delivery")
    (copy,) = list(store.read("T", 3, 0))
    assert copy.store_timestamp >= due
    assert (copy.body, copy.properties_text, copy.born_timestamp, copy.tags) == (
        source.body, source.properties_text, source.born_timestamp, "A")
    assert copy.queue_offset == 0
    manual_clock.now = due + 60_000
    status = _tick_past(store)
    assert store.max_offset("T", 3) == 1 and status["delivered"] == 1
    assert status["pending"] == {} and status["offsets"] == {2: 1}
    with open(f"{store.root}/config/delayOffset.json", encoding="utf-8") as f:
        doc = decode(f.read())
    assert doc.table == {2: 1} and doc.counted_below >= copy.phys_offset + copy.size


def test_the_levels_come_from_the_configuration(make_store, manual_clock):
    store = make_store({"store": {"message_delay_levels": "3s 1h"}})
    r = store.put(Message("T", b"x", properties={"DELAY": "7"}, queue_id=0))
    m = store.message_at(r.phys_offset)
    assert (m.queue_id, m.properties["DELAY"]) == (1, "2")  # capped at the 2nd and last
    store.wait_dispatched()
    assert store.read(SCHEDULE, 1, 0).tags_codes.tolist() == [m.store_timestamp + 3_600_000]


def test_progress_survives_a_reopen_and_is_not_delivered_again(make_store, manual_clock,
                                                               store_dir):
    store = make_store()
    for i in range(3):
        store.put(Message("T", b"m%d" % i, properties={"DELAY": "1"}, queue_id=0))
    manual_clock.advance(1_000)
    wait_for(lambda: store.max_offset("T", 0) == 3, what="three deliveries")
    store.close()
    again = make_store()
    manual_clock.advance(60_000)
    status = _tick_past(again)
    assert again.max_offset("T", 0) == 3 and status["offsets"] == {1: 3}
    assert status["recovered"] == 0


def test_a_rocketmq_broker_store_continues_its_schedule(make_store, manual_clock, tmp_path,
                                                        broker_fixture):
    with open(broker_fixture / "MANIFEST.json", encoding="utf-8") as f:
        broker_manifest = json.load(f)
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    root = tmp_path / "store"
    pending = [m for m in broker_manifest["messages"] if m["kind"] == "delay-level-18"]
    times = sorted(m["scheduleQueue"]["deliverTimestamp"] for m in pending)
    manual_clock.now = times[0] - 1
    store = make_store(root=root)
    # As RocketMQ loaded it: levels 1 and 3 delivered, level 18's ten messages pending.
    status = _tick_past(store)
    assert status["offsets"] == {1: 10, 3: 13} and status["pending"] == {18: 10}
    assert [store.max_offset("FixDelay", q) for q in range(4)] == [5, 5, 5, 5]
    assert store.max_offset("%RETRY%FixGroup", 0) == 3
    manual_clock.now = times[4]  # the first five are due
    wait_for(lambda: sum(store.max_offset("FixDelay", q) for q in range(4)) == 25,
             what="five level-18 deliveries")
    status = _tick_past(store)
    assert status["offsets"] == {1: 10, 3: 13, 18: 5} and status["pending"] == {18: 5}
    manual_clock.now = times[-1]
    wait_for(lambda: sum(store.max_offset("FixDelay", q) for q in range(4)) == 30,
             what="every level-18 delivery")
    records = {r["commitLogOffset"]: r for r in broker_manifest["expected"]["records"]}
    for m in pending:
        (source,) = [s for s in m["storedAs"] if s["topic"] == SCHEDULE]
        want = records[source["commitLogOffset"]]
        queue = int(want["properties"]["REAL_QID"])
        (copy,) = [c for c in store.read("FixDelay", queue, 5)
                   if c.uniq_key == want["uniqKey"]]
        assert copy.store_timestamp >= m["scheduleQueue"]["deliverTimestamp"]
        assert (copy.body.decode(), copy.properties_text, copy.born_timestamp, copy.flag) == (
            want["body"], want["propertiesString"], want["bornTimestamp"], want["flag"])
        assert copy.tags == "L18"
    store.close()
    text = (root / "config" / "delayOffset.json").read_text()
    assert decode(text).table == {1: 10, 3: 13, 18: 10}
    # RocketMQ's layout (fastjson, tabs, integer keys bare), mqstore's bound beside it.
    assert text.endswith('\n\t"offsetTable":{1:10,3:13,18:10\n\t}\n}')
    assert text.startswith('{\n\t"mqstoreCountedBelow":')


def test_a_timed_put_is_kept_in_the_timer_topic_and_delivered_at_its_time(make_store,
                                                                          manual_clock):
    store = make_store()
    now = manual_clock.now  # on a second
    asked = now + 5_500
    r = store.put(Message("T", b"timed", tags="A", queue_id=2,
                          properties={"TIMER_DELIVER_MS": str(asked)}))
    assert (r.status, r.queue_id, r.queue_offset) == (PutStatus.PUT_OK, 2, 0)
    m = store.message_at(r.phys_offset)
    assert (m.topic, m.queue_id) == ("rmq_sys_wheel_timer", 0)
    # RocketMQ 5's record: TIMER_OUT_MS rounded down to the second, the real topic and queue.
    assert m.properties_text == (f"TAGS\x01A\x02TIMER_DELIVER_MS\x01{asked}\x02"
                                 f"TIMER_OUT_MS\x01{now + 5_000}\x02REAL_TOPIC\x01T\x02"
                                 f"REAL_QID\x012\x02")
    manual_clock.now = asked - 1
    status = _tick_past(store)
    assert store.max_offset("T", 2) == 0 and status["timers_pending"] == 1
    manual_clock.now = now + 6_000  # the end of its second: never before the time asked
    wait_for(lambda: store.max_offset("T", 2) == 1, what="the timed delivery")
    (copy,) = list(store.read("T", 2, 0))
    assert copy.store_timestamp == now + 6_000 and copy.properties_text == m.properties_text
    assert _tick_past(store)["timers_pending"] == 0


def test_timer_delays_and_refusals(make_store, manual_clock):
    store = make_store({"store": {"timer_max_delay_sec": 60}})
    now = manual_clock.now
    r = store.put(Message("T", b"x", queue_id=0, properties={"TIMER_DELAY_SEC": "30"}))
    m = store.message_at(r.phys_offset)
    assert m.properties["TIMER_OUT_MS"] == str(now + 29_000)  # on a second: one step earlier
    past = store.put(Message("T", b"now", queue_id=0, properties={"TIMER_DELIVER_MS": "5"}))
    assert store.message_at(past.phys_offset).topic == "T"  # its time has come: stored as is
    far = store.put(Message("T", b"x", properties={"TIMER_DELAY_SEC": "61"}))
    assert far.status is PutStatus.MESSAGE_ILLEGAL
    assert "store.timer_max_delay_sec" in far.error and "61000 ms away" in far.error
    bad = store.put(Message("T", b"x", properties={"TIMER_DELIVER_MS": "soon"}))
    assert bad.status is PutStatus.MESSAGE_ILLEGAL and "'soon' must be an integer" in bad.error
    batch = store.put_batch([Message("T", b"x", properties={"TIMER_DELAY_SEC": "5"})])
    assert batch.status is PutStatus.MESSAGE_ILLEGAL and "timed" in batch.error


def test_a_damaged_delay_offsets_file_is_reported_and_left_alone(make_store, manual_clock,
                                                                 store_dir, caplog):
    store = make_store()
    store.put(Message("T", b"x", properties={"DELAY": "1"}, queue_id=0))
    store.close()
    damaged = store_dir / "config" / "delayOffset.json"
    damaged.parent.mkdir(exist_ok=True)
    damaged.write_text('{"offsetTable":{1:"ten"}}')
    caplog.set_level("ERROR", logger="mqstore.runtime.schedule")
    again = make_store()
    manual_clock.advance(60_000)
    wait_for(lambda: "level 1 offset 'ten'" in caplog.text, what="the damage reported")
    assert str(damaged) in caplog.text and "delivers nothing until it is repaired" in caplog.text
    assert not again.schedule_status()["running"] and again.max_offset("T", 0) == 0
    assert damaged.read_text() == '{"offsetTable":{1:"ten"}}'  # never replaced
    damaged.write_text('{"offsetTable":{}}')  # repaired: the next try delivers
    wait_for(lambda: again.max_offset("T", 0) == 1, what="the delivery once repaired")


def test_stats_show_the_schedule_beside_a_running_writer(make_store, manual_clock, store_dir):
    from mqstore.ops.stats import store_stats

    store = make_store()
    for level in (1, 1, 3):
        store.put(Message("T", b"x", properties={"DELAY": str(level)}, queue_id=0))
    store.put(Message("T", b"t", properties={"TIMER_DELAY_SEC": "60"}, queue_id=0))
    manual_clock.advance(1_000)
    wait_for(lambda: store.max_offset("T", 0) == 2, what="level 1 delivered")
    wait_for(lambda: (store_dir / "config" / "delayOffset.json").exists(), what="its record")
    stats = store_stats(str(store_dir), store.config, sections=("schedule",))["schedule"]
    assert stats["levels"] == {"1": {"next": 2, "max_offset": 2, "pending": 0},
                               "3": {"next": 0, "max_offset": 1, "pending": 1}}
    assert stats["timers"]["queued"] == 1
