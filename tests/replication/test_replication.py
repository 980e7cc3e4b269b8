"""Replication inside one process: a slave's receiver against a master's bytes (whole records,
blanks and their filler, divergence refused with nothing written), the SYNC_MASTER statuses,
what a slave serves, and lag as stats and health report it. Real processes and their faults
are in test_replication_processes.py."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from mqstore import Message, MessageBatch, load_config, testing
from mqstore.append.pool_writer import MapWriter
from mqstore.errors import ConfigError
from mqstore.format.ha_frame import Frame, encode_report
from mqstore.format.record import BLANK_MAGIC, BLANK_RECORD
from mqstore.message import GetStatus, PutStatus
from mqstore.ops.stats import store_stats
from mqstore.replication import ReplicaDiverged, SlaveAcks
from mqstore.replication.status_file import read_status
from mqstore.testing import patience

from replication_support import log_bytes

SEG = 65536
WAIT_S = 15.0
FAST = {"ha_heartbeat_interval_ms": 100, "ha_housekeeping_interval_ms": 3000}

pytestmark = pytest.mark.loops("thread")


def wait_for(condition):
    return testing.wait_for(condition, timeout=WAIT_S)


@pytest.fixture
def pair(make_store, tmp_path):
    """``pair(role="async_master", start_slave=True, **store)``: a master listening on a free
    port and a slave of it (its replication started or not), 64 KiB segments."""
    def make(role="async_master", start_slave=True, master_store=None, slave_store=None,
             **store):
        cfg = {"commit_log": {"segment_bytes": SEG}, "store": {**FAST, **store}}
        m = make_store({**cfg, "store": {**cfg["store"], "role": role, **(master_store or {})},
                        "server": {"ha_listen": "127.0.0.1:0"}}, root=tmp_path / "master")
        m.replication.start()
        s = make_store({**cfg, "store": {**cfg["store"], "role": "slave", **(slave_store or {})},
                        "server": {"ha_master": m.replication.address}}, root=tmp_path / "slave")
        if start_slave:
            s.replication.start()
        return m, s
    return make


def fill(store, n: int, topic: str = "orders", seed: int = 0) -> None:
    """``n`` messages of mixed sizes over 4 queues, with keys and tags."""
    bodies = [b"%d-" % (seed + i) * (1 + (seed + i) % 61) for i in range(n)]
    r = store.put_batch(MessageBatch(topic=topic, bodies=bodies, queue_ids=[i % 4 for i in range(n)],
                                     tags=["t%d" % (i % 3) for i in range(n)],
                                     keys=[["k%d" % (seed + i)] for i in range(n)]))
    assert r.status.stored


def units(store, topic: str, queue_id: int, begin: int) -> np.ndarray:
    cq = store.consume_queue(topic, queue_id)
    out = []
    for seg in cq.segments.segments:
        out.append(cq.units_of(seg)[:seg.wrote // 20])
    return np.concatenate(out)[begin:]


def caught_up(m, s) -> bool:
    return s.max_phys_offset == m.max_phys_offset


# -- the receiver --------------------------------------------------------------------------
def frames(master, begin: int, end: int, chunk: int) -> list[Frame]:
    """The master's log from ``begin`` as frames of ``chunk`` bytes cut as a master cuts them
    (never across a segment end)."""
    out, pos = [], begin
    while pos < end:
        stop = min(end, pos + chunk, pos - pos % SEG + SEG)
        out.append(Frame(pos, log_bytes(master, pos, stop)))
        pos = stop
    return out


def feed(receiver, master, begin: int, end: int, chunk: int) -> None:
    for frame in frames(master, begin, end, chunk):
        receiver.accept(*frame)


@pytest.mark.parametrize("chunk", [777, 32768])
def test_frames_cut_anywhere_make_a_byte_identical_log_and_the_same_queues(pair, chunk):
    m, s = pair(start_slave=False)
    fill(m, 1500)  # about 3.5 segments: blank records and their filler come across
    m.wait_dispatched()
    end = m.max_phys_offset
    receiver = s.replication.receiver
    assert receiver.begin() == 0
    if chunk < 1024:
        feed(receiver, m, 0, end, chunk)
    else:  # as a read brings them: several frames, a heartbeat among them, checked as one
        got = frames(m, 0, end, chunk)
        for i in range(0, len(got), 5):
            first, *rest = got[i:i + 5]
            beat = Frame(first.phys_offset + len(first.body), b"")  # the next offset to send
            receiver.accept_all([first, beat, *rest])
    assert receiver.end == end == s.max_phys_offset
    assert log_bytes(s, 0, end) == log_bytes(m, 0, end)
    s.wait_dispatched()
    for q in range(4):
        assert np.array_equal(units(s, "orders", q, 0), units(m, "orders", q, 0))
    got = s.query_by_key("orders", "k1499")
    assert [x.body for x in got] == [b"1499-" * (1 + 1499 % 61)]


def test_a_cut_record_waits_for_the_rest_and_the_log_ends_on_records(pair):
    m, s = pair(start_slave=False)
    fill(m, 40)
    first = m.message_at(0)
    size = len(log_bytes(m, 0, m.max_phys_offset)) // 40  # any cut inside the first records
    receiver = s.replication.receiver
    receiver.begin()
    receiver.accept(0, log_bytes(m, 0, size // 2))
    assert receiver.end == 0 and receiver.acknowledged() == 0  # nothing whole yet
    receiver.accept(size // 2, log_bytes(m, size // 2, m.max_phys_offset))
    assert receiver.end == m.max_phys_offset
    assert s.message_at(0).body == first.body


def test_a_frame_at_another_offset_is_refused_and_writes_nothing(pair):
    m, s = pair(start_slave=False)
    fill(m, 100)
    end = m.max_phys_offset
    receiver = s.replication.receiver
    receiver.begin()
    feed(receiver, m, 0, end // 2, 500)
    before = receiver.end
    with pytest.raises(ReplicaDiverged) as err:
        receiver.accept(end // 2 + 8, log_bytes(m, end // 2 + 8, end))
    assert f"offset {end // 2 + 8}" in str(err.value) and "diverge" in str(err.value)
    assert receiver.end == before
    # A new connection starts again from the log's end (partial bytes forgotten).
    assert receiver.begin() == before
    feed(receiver, m, before, end, 500)
    assert log_bytes(s, 0, end) == log_bytes(m, 0, end)


def test_a_slave_whose_last_record_differs_is_refused_with_nothing_written(pair, make_store,
                                                                           tmp_path):
    m, s = pair(start_slave=False)
    fill(m, 50)
    # The slave's log: another store's, the same records but a different last one.
    other = make_store({"commit_log": {"segment_bytes": SEG}}, root=tmp_path / "other")
    fill(other, 49)
    other.put(Message("orders", b"a record the master never had", queue_id=1))
    receiver = s.replication.receiver
    receiver.begin()
    feed(receiver, other, 0, other.max_phys_offset, 32768)
    end = receiver.end
    assert end == other.max_phys_offset != m.max_phys_offset
    assert receiver.begin() == end
    with pytest.raises(ReplicaDiverged) as err:
        feed(receiver, m, end, m.max_phys_offset, 32768)
    text = str(err.value)
    assert f"commit-log offset {end}" in text and "diverge" in text and "nothing" in text
    assert receiver.end == end
    assert log_bytes(s, 0, end) == log_bytes(other, 0, end)


def test_a_whole_record_that_names_another_offset_is_refused(pair):
    """Bytes that are a sound record, but of another place in the log (a record that differs
    from the one the master has there), are no continuation of this log."""
    m, s = pair(start_slave=False)
    fill(m, 20)
    m.wait_dispatched()
    first = m.message_at(0)
    second = m.get("g", "orders", 2, 0, 1).messages[0]  # the third record of the log
    receiver = s.replication.receiver
    receiver.begin()
    receiver.accept(0, log_bytes(m, 0, first.size))
    elsewhere = log_bytes(m, second.phys_offset, second.phys_offset + second.size)
    with pytest.raises(ReplicaDiverged, match=f"physical offset field {second.phys_offset} "
                                              f"!= position {first.size}"):
        receiver.accept(first.size, elsewhere)
    assert receiver.end == first.size


@pytest.mark.parametrize("case", ["misaligned first frame", "crossing frame", "short blank",
                                  "record too large"])
def test_segment_size_and_record_limits_are_checked(pair, case):
    m, s = pair(start_slave=False, slave_store={}, master_store={})
    fill(m, 400)
    receiver = s.replication.receiver
    receiver.begin()
    data = log_bytes(m, 0, SEG)
    if case == "misaligned first frame":
        with pytest.raises(ReplicaDiverged, match="not at a segment start"):
            receiver.accept(SEG // 2, data[:100])
    elif case == "crossing frame":
        with pytest.raises(ReplicaDiverged, match="crosses the end"):
            receiver.accept(0, data + b"\0" * 10)
    elif case == "short blank":
        at = _blank_position(data)
        bad = data[:at] + BLANK_RECORD.pack(SEG - at - 8, BLANK_MAGIC) + data[at + 8:]
        with pytest.raises(ReplicaDiverged, match="segments are not 65536 bytes"):
            receiver.accept(0, bad)
        assert receiver.end == 0  # nothing of a frame that breaks the rules is written
    else:
        big = bytearray(data[:200])
        big[0:4] = (9 << 20).to_bytes(4, "big")
        with pytest.raises(ReplicaDiverged):
            receiver.accept(0, bytes(big))
        assert receiver.end == 0


def _blank_position(data: bytes) -> int:
    pos = 0
    while True:
        total, magic = BLANK_RECORD.unpack_from(data, pos)
        if magic == BLANK_MAGIC:
            return pos
        pos += total


def test_filler_that_is_not_zeros_is_copied(pair):
    m, s = pair(start_slave=False)
    fill(m, 400)
    data = bytearray(log_bytes(m, 0, SEG))
    at = _blank_position(bytes(data))
    data[at + 8:] = b"\x5a" * (SEG - at - 8)  # stale bytes past a blank, as after a recovery
    receiver = s.replication.receiver
    receiver.begin()
    receiver.accept(0, bytes(data[:at + 20]))
    assert receiver.end == SEG and receiver.acknowledged() == at + 20  # no more than received
    receiver.accept(at + 20, bytes(data[at + 20:]))
    assert receiver.acknowledged() == SEG
    assert log_bytes(s, 0, SEG) == bytes(data)


# -- SYNC_MASTER -----------------------------------------------------------------------------
def test_slave_acks_follow_rocketmqs_rules():
    ok, disk = PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT
    acks = SlaveAcks(sync=True, timeout_s=0.3, fallbehind_max=1000)
    assert acks.complete_put(100, True, ok) is PutStatus.SLAVE_NOT_AVAILABLE  # no slave
    assert acks.complete_put(100, False, ok) is ok  # WAIT=false never waits
    slave = object()
    acks.attach(slave, 0)
    assert acks.complete_put(1000, True, ok) is PutStatus.SLAVE_NOT_AVAILABLE  # 1000 behind
    began = time.monotonic()
    assert acks.complete_put(999, True, ok) is PutStatus.FLUSH_SLAVE_TIMEOUT
    assert time.monotonic() - began >= 0.25
    acks.timeout_s = 30  # the ack below comes from a timer: certain to come within this
    threading.Timer(0.05, acks.acked, (slave, 999)).start()
    assert acks.complete_put(999, True, ok) is ok
    acks.timeout_s = 0.3
    assert acks.complete_put(500, True, disk) is disk  # the flush's failure stays
    assert acks.complete_put(1200, True, disk) is PutStatus.FLUSH_SLAVE_TIMEOUT  # replaced
    acks.detach(slave)
    assert acks.complete_put(10, True, ok) is PutStatus.SLAVE_NOT_AVAILABLE
    asynchronous = SlaveAcks(sync=False, timeout_s=0.3, fallbehind_max=1000)
    assert asynchronous.complete_put(10**9, True, ok) is ok


def test_a_waiting_put_answers_when_replication_stops():
    acks = SlaveAcks(sync=True, timeout_s=30.0, fallbehind_max=1 << 20)
    acks.attach(object(), 0)
    threading.Timer(0.1, acks.stop).start()
    began = time.monotonic()
    assert acks.complete_put(50, True, PutStatus.PUT_OK) is PutStatus.FLUSH_SLAVE_TIMEOUT
    assert time.monotonic() - began < patience(10)


def test_sync_master_puts_wait_for_the_slave_and_for_the_flush(pair):
    m, s = pair(role="sync_master", master_store={}, slave_store={})
    assert wait_for(lambda: m.replication.status()["slaves"])
    r = m.put(Message("orders", b"acked", queue_id=0))
    assert r.status is PutStatus.PUT_OK
    assert s.replication.receiver.end >= r.phys_offset + r.size
    assert s.message_at(r.phys_offset).body == b"acked"
    b = m.put_batch(MessageBatch(topic="orders", bodies=[b"a", b"b"], queue_ids=0))
    assert b.status is PutStatus.PUT_OK and s.max_phys_offset >= int(b.phys_offsets[-1])
    s.replication.stop()  # the slave goes: nobody to acknowledge
    assert wait_for(lambda: not m.replication.status()["slaves"])
    lost = m.put(Message("orders", b"no slave", queue_id=0))
    assert lost.status is PutStatus.SLAVE_NOT_AVAILABLE
    assert m.message_at(lost.phys_offset).body == b"no slave"  # stored all the same
    nowait = m.put(Message("orders", b"no wait", queue_id=0, properties={"WAIT": "false"}))
    assert nowait.status is PutStatus.PUT_OK


def test_sync_master_with_sync_flush_answers_once_both_hold_the_put(make_store, tmp_path):
    m = make_store({"commit_log": {"segment_bytes": SEG}, "flush": {"policy": "sync"},
                    "store": {**FAST, "role": "sync_master"},
                    "server": {"ha_listen": "127.0.0.1:0"}}, root=tmp_path / "m")
    m.replication.start()
    s = make_store({"commit_log": {"segment_bytes": SEG}, "store": {**FAST, "role": "slave"},
                    "server": {"ha_master": m.replication.address}}, root=tmp_path / "s")
    s.replication.start()
    assert wait_for(lambda: m.replication.status()["slaves"])
    for i in range(20):
        r = m.put(Message("orders", b"both %d" % i, queue_id=i % 2))
        assert r.status is PutStatus.PUT_OK
        end = r.phys_offset + r.size
        # The flush loop publishes its flushed end before it wakes the puts the force covers.
        assert m.internals.channels.flush.flushed >= end and s.replication.receiver.end >= end


def test_a_slave_that_never_acknowledges_times_a_put_out(make_store, tmp_path):
    m = make_store({"commit_log": {"segment_bytes": SEG}, "flush": {"sync_timeout_ms": 300},
                    "store": {**FAST, "role": "sync_master"},
                    "server": {"ha_listen": "127.0.0.1:0"}}, root=tmp_path / "m")
    m.replication.start()
    host, port = m.replication.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as mute:
        mute.sendall(encode_report(0))  # a slave that reports once, then only reads
        assert wait_for(lambda: m.replication.status()["slaves"])
        r = m.put(Message("orders", b"unacknowledged", queue_id=0))
        assert r.status is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert m.message_at(r.phys_offset).body == b"unacknowledged"
        assert m.replication.problems() == []
    assert wait_for(lambda: m.replication.problems() != [])
    assert "SLAVE_NOT_AVAILABLE" in m.replication.problems()[0]


# -- what a slave is -------------------------------------------------------------------------
def test_a_slave_serves_what_a_master_serves(pair, tmp_path):
    m, s = pair(slave_store={}, master_store={})
    # connected before the first put: a new slave that reported later would start at the
    # master's last segment (RocketMQ's rule), without the queues' first offsets
    assert wait_for(lambda: m.replication.status()["slaves"])
    fill(m, 300)
    assert wait_for(lambda: caught_up(m, s))
    s.wait_dispatched()
    m.wait_dispatched()
    for q in range(4):
        assert s.max_offset("orders", q) == m.max_offset("orders", q)
        got_m, got_s = m.get("g", "orders", q, 0, 32), s.get("g", "orders", q, 0, 32)
        assert got_s.status is GetStatus.FOUND
        assert [x.body for x in got_s.messages] == [x.body for x in got_m.messages]
        assert [x.phys_offset for x in got_s.messages] == [x.phys_offset for x in got_m.messages]
        t = got_m.messages[5].store_timestamp
        assert s.offset_by_time("orders", q, t) == m.offset_by_time("orders", q, t)
    assert [x.body for x in s.query_by_key("orders", "k7")] == [b"7-" * 8]
    with s.consumer("g", "orders", consume_from="first") as consumer:
        polled = consumer.poll(1000, timeout_ms=2000)
        assert len(polled) > 0
    assert s.put(Message("orders", b"x")).status is PutStatus.SERVICE_NOT_AVAILABLE


def test_a_slave_writes_through_its_map_whatever_writer_kind_says(make_store, tmp_path):
    s = make_store({"writer": {"kind": "transient_pool"}, "store": {"role": "slave"}},
                   root=tmp_path / "s")
    assert isinstance(s.internals.writer, MapWriter)
    m = make_store({"writer": {"kind": "transient_pool"}}, root=tmp_path / "m")
    assert not isinstance(m.internals.writer, MapWriter)


def test_get_on_a_master_suggests_pulling_from_the_slave_past_the_memory_share(make_store):
    # 40% of 100 KiB: a pull that leaves more than 40 KiB of newer log behind it.
    m = make_store({"get": {"physical_memory_bytes": 100 * 1024}})
    fill(m, 2000)
    m.wait_dispatched()
    assert m.get("g", "orders", 0, 0, 4).suggest_pulling_from_slave is True
    tail = m.max_offset("orders", 0) - 4
    assert m.get("g", "orders", 0, tail, 4).suggest_pulling_from_slave is False


# -- lag, status, health ---------------------------------------------------------------------
def test_lag_and_status_on_both_sides(pair):
    m, s = pair(slave_store={}, master_store={})
    fill(m, 500)
    assert wait_for(lambda: caught_up(m, s))
    end = m.max_phys_offset
    assert wait_for(lambda: m.replication.status()["slaves"]
                    and m.replication.status()["slaves"][0]["ack_offset"] == end)
    (slave,) = m.replication.status()["slaves"]
    assert slave["lag_bytes"] == 0
    status = s.replication.status()
    assert status["connected"] and status["offset"] == end and status["master_offset"] == end
    assert status["lag_bytes"] == 0 and s.replication.problems() == []
    # Other processes read it from replication.json (mqstore stats).
    assert wait_for(lambda: (read_status(s.root) or {}).get("offset") == end)
    stats = store_stats(m.root, m.config)["replication"]
    assert stats["role"] == "async_master" and stats["slaves"][0]["ack_offset"] == end
    m.replication.stop()  # the master goes
    assert wait_for(lambda: s.replication.problems() != [])
    (problem,) = s.replication.problems()
    assert "master" in problem and "lost" in problem and m.replication.master.address in problem


def test_replication_settings_are_checked():
    with pytest.raises(ConfigError, match="ha_housekeeping_interval_ms"):
        load_config(overrides={"store": {"ha_heartbeat_interval_ms": 5000,
                                         "ha_housekeeping_interval_ms": 5000}})
    with pytest.raises(ConfigError, match="port 0"):
        load_config(overrides={"server": {"ha_master": "127.0.0.1:0"}})
    with pytest.raises(ConfigError, match="ha_transfer_batch_bytes"):
        load_config(overrides={"store": {"ha_transfer_batch_bytes": 8 << 20}})


def test_a_slave_without_a_master_address_says_so(make_store, tmp_path):
    s = make_store({"store": {"role": "slave"}}, root=tmp_path / "s")
    with pytest.raises(ConfigError, match="server.ha_master"):
        s.replication.start()
    assert not os.path.exists(os.path.join(s.root, "replication.json"))
