"""Roles at run time on open stores (``store.roles``, ``mqstore.roles``): a slave promoted
while it runs, promotions refused while the master serves the slave or when the slave lacks
acknowledged bytes, fencing, and a master demoted to follow another one, cutting and keeping
what its new master lacks (NOTE [ Rejoining ]). The stores run the default configuration
(worker processes)."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading

import pytest

from mqstore import Message, MessageBatch, testing
from mqstore.errors import PromotionRefusedError
from mqstore.format import ha_hello as hello
from mqstore.format.epoch_file import EpochEntry
from mqstore.format.ha_frame import encode_header, encode_status
from mqstore.format.state_record import STATE_TOPIC
from mqstore.mirror.replica_state import fresh, write_state
from mqstore.message import PutStatus
from mqstore.storage.epoch_file import EpochFile
from mqstore.storage.queue_manifest import read_entries
from mqstore.storage.role_file import read_role

from replication_support import log_bytes

SEG = 65536
WAIT_S = 20.0
SECRET = b"0123456789abcdef0123456789abcdef"
FAST = {"ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000}


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "ha.secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


@pytest.fixture
def node(make_store, tmp_path, secret_file):
    """``node(name, role, **server)``: a store with mqstore's handshake (the shared secret),
    listening for slaves on a free port (a slave listens once promoted)."""
    def make(name, role, **server):
        port = _free_port()
        return make_store({"commit_log": {"segment_bytes": SEG}, "store": {**FAST, "role": role},
                           "server": {"ha_listen": f"127.0.0.1:{port}",
                                      "ha_secret_file": secret_file, **server}},
                          root=tmp_path / name)
    return make


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ha_of(store) -> str:
    return store.config.server.ha_listen


def follow(master, slave) -> None:
    assert testing.wait_for(lambda: slave.max_phys_offset == master.max_phys_offset,
                            timeout=WAIT_S)


def batch(topic, bodies, queue_ids, keys=None):
    return MessageBatch(topic=topic, bodies=bodies, queue_ids=queue_ids, keys=keys)


def test_a_slave_promoted_while_it_runs_takes_puts_where_its_master_left(node):
    m = node("m", "async_master")
    m.replication.start()
    s = node("s", "slave", ha_master=ha_of(m))
    s.replication.start()
    first = m.put_batch(batch("orders", [b"m%d" % i for i in range(40)], [i % 4 for i in range(40)]))
    assert first.status is PutStatus.PUT_OK
    follow(m, s)
    refused = s.put(Message("orders", b"early", queue_id=1))
    assert (refused.status, refused.error) == (PutStatus.SERVICE_NOT_AVAILABLE, "store role is slave")
    end = m.max_phys_offset
    m.close()
    assert testing.wait_for(lambda: not s.replication.status()["connected"], timeout=WAIT_S)
    result = s.promote()
    assert result == {"role": "async_master", "epoch": 2, "start_offset": end,
                      "followed": ha_of(m), "lacked": None, "forced": False, "mirror": None}
    put = s.put(Message("orders", b"after", queue_id=1))
    assert put.status is PutStatus.PUT_OK
    assert (put.queue_offset, put.phys_offset) == (10, end)  # the master gave out 0..9
    assert EpochFile(s.root).entries == [EpochEntry(1, 0), EpochEntry(2, end)]
    record, problem = read_role(s.root)
    assert problem is None and (record.role, record.master, record.epoch) == (
        "async_master", None, 2)
    assert s.replication.address == ha_of(s)  # listening for slaves of its own
    # The recorded role wins over store.role at the next open.
    config, root = s.config, s.root
    s.close()
    again = type(s).open(root, config)
    try:
        assert again.role_state.role == "async_master"
        assert again.put(Message("orders", b"again", queue_id=1)).queue_offset == 11
    finally:
        again.close()


def _stateful_pair(node):
    """A master whose group committed offsets and whose topic has 8 queues, and its slave
    holding all of it (the state mirror's snapshot included), the master closed."""
    m = node("m", "async_master")
    m.create_topic("orders", queues=8)
    m.replication.start()
    s = node("s", "slave", ha_master=ha_of(m))
    s.replication.start()
    m.put_batch(batch("orders", [b"m%d" % i for i in range(16)], [i % 8 for i in range(16)]))
    m.commit_consumer_offsets("billing", "orders", {q: 1 + q % 2 for q in range(8)})
    assert testing.wait_for(lambda: s.replication.status()["state_mirror"]["complete"],
                            timeout=WAIT_S)
    committed = m.committed_offsets("billing", "orders")
    m.replication.shipper.ship_now()  # the commit's records, before the master goes
    follow(m, s)
    m.close()
    assert testing.wait_for(lambda: not s.replication.status()["connected"], timeout=WAIT_S)
    return s, committed


def test_a_promotion_installs_the_masters_state(node):
    s, committed = _stateful_pair(node)
    result = s.promote()
    assert {"config/topics.json", "config/consumerOffset.json.journal"} <= set(
        result["mirror"]["installed"])
    assert s.committed_offsets("billing", "orders") == committed == {
        q: 1 + q % 2 for q in range(8)}
    assert {q: 2 for q in range(8)} == {q: s.max_offset("orders", q) for q in range(8)}
    config = s.topic_config("orders")
    assert (config.read_queue_nums, config.write_queue_nums) == (8, 8)


def test_a_promotion_without_a_complete_snapshot_is_refused_unless_forced(node):
    s, _committed = _stateful_pair(node)
    write_state(s.root, fresh())  # as if its snapshot's end had not arrived
    with pytest.raises(PromotionRefusedError, match="no complete snapshot.*promote with force"):
        s.promote()
    assert s.role_state.is_slave and s.put(Message("orders", b"x")).error == \
        "store role is slave"
    result = s.promote(force=True)
    assert (result["role"], result["forced"], result["mirror"]) == ("async_master", True, None)
    assert s.committed_offsets("billing", "orders") == {}  # its own state: none


def test_promotion_is_refused_while_the_master_serves_the_slave(node):
    m = node("m", "async_master")
    m.replication.start()
    s = node("s", "slave", ha_master=ha_of(m))
    s.replication.start()
    assert testing.wait_for(lambda: s.replication.status()["connected"], timeout=WAIT_S)
    with pytest.raises(PromotionRefusedError, match=f"connected to its master {ha_of(m)}, "
                                                    f"which serves it: promoting it now would "
                                                    f"make two masters"):
        s.promote()
    assert s.role_state.is_slave and read_role(s.root) == (None, None)


class FakeMaster:
    """An mqstore master that says it answered PUT_OK up to ``confirmed`` and sends the log
    ``data`` only up to ``upto``, then keeps the connection open until ``release``."""

    def __init__(self, data: bytes, upto: int, confirmed: int) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.release = threading.Event()
        self.sent = threading.Event()
        threading.Thread(target=self._run, args=(data, upto, confirmed), daemon=True).start()

    def _run(self, data: bytes, upto: int, confirmed: int) -> None:
        with self.server, self.server.accept()[0] as sock:
            sock.settimeout(WAIT_S)
            opened = _read(sock, 8)
            challenge = hello.encode_challenge(1, hello.AUTH_HMAC, bytes(32))
            sock.sendall(challenge)
            head = _read(sock, 8)
            proof = head + _read(sock, hello.parse_header(head).length)
            me = hello.NodeInfo(hello.ROLE_MASTER, len(data), confirmed, (EpochEntry(1, 0),))
            sock.sendall(hello.encode_result(1, hello.ACCEPTED, "", SECRET,
                                             opened + challenge + proof,
                                             hello.encode_fields(me)))
            _read(sock, 8)  # the slave's first report: 0
            sock.sendall(encode_status(hello.encode_fields(me, epochs=False)))
            at = 0
            while at < upto:
                chunk = data[at:min(upto, at + 32768, (at // SEG + 1) * SEG)]
                sock.sendall(encode_header(at, len(chunk)) + chunk)
                at += len(chunk)
            self.sent.set()
            self.release.wait(WAIT_S)


def _read(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk
        out += chunk
    return out


def test_a_slave_lacking_acknowledged_bytes_is_refused_unless_forced(node, make_store, tmp_path):
    src = make_store({"commit_log": {"segment_bytes": SEG}}, root=tmp_path / "src")
    src.put_batch(batch("orders", [b"%05d" % i * 20 for i in range(60)], [0] * 60))
    data = log_bytes(src, 0, src.max_phys_offset)
    upto = src.put(Message("orders", b"x")).phys_offset - 1000  # a record boundary below
    upto = next(p for p in range(upto, 0, -1) if src.message_at(p) is not None)
    fake = FakeMaster(data, upto, len(data))
    s = node("s", "slave", ha_master=fake.address)
    s.replication.start()
    assert fake.sent.wait(WAIT_S)
    assert testing.wait_for(lambda: s.max_phys_offset == upto, timeout=WAIT_S)
    assert testing.wait_for(lambda: s.role_state.master_confirmed == len(data), timeout=WAIT_S)
    fake.release.set()
    assert testing.wait_for(lambda: not s.replication.status()["connected"], timeout=WAIT_S)
    lacks = len(data) - upto
    with pytest.raises(PromotionRefusedError,
                       match=rf"log ends at {upto}, but its master {fake.address} had "
                             rf"answered PUT_OK up to {len(data)} .* it lacks {lacks} bytes "
                             rf"\[{upto}, {len(data)}\)"):
        s.promote()
    assert s.role_state.is_slave
    result = s.promote(force=True)
    assert result["lacked"] == {"from": upto, "to": len(data), "bytes": lacks}
    assert result["forced"] and s.put(Message("orders", b"y")).status is PutStatus.PUT_OK


def test_a_fenced_master_refuses_puts_and_its_guard_is_asked_before_and_after(node):
    m = node("m", "async_master")
    assert m.put(Message("t", b"a")).status is PutStatus.PUT_OK
    answers = iter([True, False])
    m.role_state.guard = lambda: next(answers, False)
    end = m.max_phys_offset
    late = m.put(Message("t", b"b"))  # passed the check before it, failed the one after
    assert late.status is PutStatus.SERVICE_NOT_AVAILABLE and m.max_phys_offset > end
    refused = m.put(Message("t", b"c"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "write guard (the coordination lease) does not hold" in refused.error
    m.role_state.guard = None
    m.fence("the lease ran out")
    assert m.put(Message("t", b"d")).error == "fenced: the lease ran out"
    assert m.promote(epoch=7)["epoch"] == 7  # elected again, in a new epoch
    assert m.put(Message("t", b"e")).status is PutStatus.PUT_OK
    assert EpochFile(m.root).entries[-1] == EpochEntry(7, m.max_phys_offset - (
        m.max_phys_offset - EpochFile(m.root).entries[-1].start))


def test_a_demoted_master_cuts_and_keeps_what_its_new_master_lacks(node):
    m = node("m", "async_master")
    m.replication.start()
    s = node("s", "slave", ha_master=ha_of(m))
    s.replication.start()
    m.put_batch(batch("orders", [b"shared-%d" % i for i in range(30)], [i % 3 for i in range(30)],
                      [f"k{i}" for i in range(30)]))
    follow(m, s)
    s.replication.stop_following()
    point = s.max_phys_offset
    lost = m.put_batch(batch("orders", [b"lost-%d" % i for i in range(7)], [0, 1, 1, 2, 2, 2, 0],
                             [f"lost{i}" for i in range(7)]))
    with m.consumer("billing", "orders", auto_commit=False) as c:  # state of its own
        c.poll(max_msgs=5)
        c.commit()
    m.replication.stop()  # its state shipper too: the commit's state records are in the log
    m_end = m.max_phys_offset
    s.role_state.change(master_confirmed=-1)  # it never heard of the lost puts
    s.promote()
    s.put_batch(batch("orders", [b"new-%d" % i for i in range(5)], [0, 1, 2, 0, 1],
                      [f"new{i}" for i in range(5)]))
    result = m.demote(ha_of(s))
    assert result == {"role": "slave", "master": ha_of(s), "was": "async_master"}

    def rejoined():
        try:
            return m.max_phys_offset == s.max_phys_offset and m.role_state.is_slave
        except Exception:  # noqa: BLE001 - reopening for the cut
            return False
    assert testing.wait_for(rejoined, timeout=WAIT_S)
    with open(os.path.join(m.root, "quarantine", f"rejoin-{point:020d}.json")) as f:
        report = json.load(f)
    # The 7 lost puts, and the state records of the group's commit when the shipper put
    # them before it stopped (else they wait in the change feed for its next start).
    shipped = report["queues"].pop(f"{STATE_TOPIC}/0", {"records": 0})["records"]
    assert (report["from"], report["to"], report["bytes"], report["records"]) == (
        point, m_end, m_end - point, 7 + shipped)
    qoffs = lost.queue_offsets.tolist()
    assert report["queues"] == {
        "orders/0": {"records": 2, "first_queue_offset": qoffs[0], "last_queue_offset": qoffs[6]},
        "orders/1": {"records": 2, "first_queue_offset": qoffs[1], "last_queue_offset": qoffs[2]},
        "orders/2": {"records": 3, "first_queue_offset": qoffs[3], "last_queue_offset": qoffs[5]}}
    kept = open(os.path.join(m.root, "quarantine", report["file"]), "rb").read()
    assert len(kept) == m_end - point and b"lost-6" in kept
    aside = report["set_aside"]
    assert aside["directory"] == f"replica-previous/rejoin-{point:020d}"
    assert any(f.startswith("config/consumerOffset.json") for f in aside["files"]), aside
    assert not any(os.path.exists(os.path.join(m.root, f)) for f in aside["files"])
    assert log_bytes(m, 0, m.max_phys_offset) == log_bytes(s, 0, s.max_phys_offset)
    m.wait_dispatched(WAIT_S)
    s.wait_dispatched(WAIT_S)
    for q in range(3):  # the master's offsets, no filler for what was cut
        assert m.max_offset("orders", q) == s.max_offset("orders", q)
        assert [x.body for x in m.read("orders", q, 0, 100)] == \
            [x.body for x in s.read("orders", q, 0, 100)]
    # The manifest was lowered to the queues' ends at the point (the master's offsets grow
    # from there); it had recorded the cut offsets (12, 12, 13) when the master closed.
    entries, _ = read_entries(m.root)
    assert {k: e[1] for k, e in entries.items()} == {("orders", q): 10 for q in range(3)}
    assert all(phys <= point for _first, _end, phys in entries.values())
    assert m.query_by_key("orders", "lost3") == []
    assert [x.body for x in m.query_by_key("orders", "new1")] == [b"new-1"]
    assert read_role(m.root)[0].cut is None
    assert EpochFile(m.root).entries == EpochFile(s.root).entries
    refused = m.put(Message("orders", b"no"))
    assert (refused.status, refused.error) == (PutStatus.SERVICE_NOT_AVAILABLE,
                                               "store role is slave")


def test_a_master_elected_again_before_it_wrote_takes_the_new_epoch_in_place(node):
    m = node("m", "async_master")
    assert EpochFile(m.root).entries == [EpochEntry(1, 0)]  # nothing written in epoch 1
    m.fence("the lease ran out")
    assert m.promote(epoch=3) == {"role": "async_master", "epoch": 3, "start_offset": 0,
                                  "followed": None, "lacked": None, "forced": False,
                                  "mirror": None}
    assert EpochFile(m.root).entries == [EpochEntry(3, 0)]  # one entry per start offset
    assert m.put(Message("t", b"a")).status is PutStatus.PUT_OK
    m.fence("again")
    end = m.max_phys_offset
    assert m.promote(epoch=4)["start_offset"] == end
    assert EpochFile(m.root).entries == [EpochEntry(3, 0), EpochEntry(4, end)]


def test_the_write_guard_and_its_status_outlive_a_reopen(node):
    m = node("m", "async_master")
    other = node("o", "async_master")
    allowed = [True]
    m.set_write_guard(lambda: allowed[0], lambda: {"leader": "m", "may_write": allowed[0]})
    assert m.role_status()["coordination"] == {"leader": "m", "may_write": True}
    allowed[0] = False
    refused = m.put(Message("t", b"a"))
    assert "write guard (the coordination lease) does not hold" in refused.error
    done = m.demote(ha_of(other))  # reopens the store as a slave
    assert done == {"role": "slave", "master": ha_of(other), "was": "async_master"}
    assert m.role_state.guard is not None and m.role_state.guard() is False
    assert m.role_status()["coordination"] == {"leader": "m", "may_write": False}
    assert m.demote(ha_of(other), if_needed=True) == {
        "role": "slave", "master": ha_of(other), "was": "slave", "unchanged": True}


def test_a_master_demoted_for_a_reason_already_saying_fenced_says_it_once(node):
    """The refusal of a master demoted because a newer one exists reads as the docs print it
    ("fenced: peer ... holds epoch 2 ..."), not with the word twice."""
    m = node("m", "async_master")
    seen: list[str] = []
    m.role_state.watch(lambda state: seen.append(state.fenced))
    why = "fenced: peer 127.0.0.1:1 holds epoch 2, newer than this master's 1"
    m.demote("127.0.0.1:1", why=why)
    assert why in seen
    other = node("o", "async_master")
    other.role_state.watch(lambda state: seen.append(state.fenced))
    other.demote("127.0.0.1:1", why="maintenance")
    assert "fenced: maintenance" in seen
