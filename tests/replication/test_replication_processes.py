"""Replication between real processes on 127.0.0.1, default worker processes: masters are store
processes that put (``replica_proc.py``), slaves are ``mqstore serve`` deployments. A new slave
catching up, one far behind, SIGKILL of either side, the network cut mid-frame, diverging logs,
garbage, truncated frames and port scanners; logs compared byte for byte and consume queues
unit for unit."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mqstore import load_config
from mqstore.format.cq_unit import CQ_DTYPE, FILLER_SIZE
from mqstore.format.ha_frame import encode_header, encode_report
from mqstore.ops.stats import store_stats
from mqstore.replication.status_file import read_status
from cli_support import mqstore_json
from gate_proxy import CuttingProxy
from replication_procs import SEG, WAIT_S, Master, Slave, base_config, read_exact, wait_for

pytestmark = [pytest.mark.usefixtures("no_plugin_env", "watchdog")]
QUEUES = 4


def all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in the stopped state (a SIGSTOP reaches them one by one)."""
    tasks = Path(f"/proc/{pid}/task")
    return all("T (stopped)" in (tasks / t / "status").read_text() for t in os.listdir(tasks))


def segment_files(root: Path) -> dict[str, bytes]:
    d = root / "commitlog"
    return {name: (d / name).read_bytes() for name in sorted(os.listdir(d)) if name.isdigit()}


def cq_units(root: Path, queue_id: int) -> np.ndarray:
    """Every unit written to a queue's files, at its queue offset (files are named by where
    they start; a queue whose first files are missing reads zeros there), up to the last."""
    d = root / "consumequeue" / "orders" / str(queue_id)
    files = sorted((int(n), d / n) for n in os.listdir(d) if n.isdigit()) if d.exists() else []
    if not files:
        return np.zeros(0, dtype=CQ_DTYPE)
    parts = [(start // 20, np.frombuffer(path.read_bytes(), dtype=CQ_DTYPE))
             for start, path in files]
    units = np.zeros(max(at + len(u) for at, u in parts), dtype=CQ_DTYPE)
    for at, u in parts:
        units[at:at + len(u)] = u
    written = np.flatnonzero(units["size"] != 0)
    return units[:written[-1] + 1] if len(written) else units[:0]


def same_queues(master: Path, slave: Path) -> bool:
    """The slave's units equal the master's at every queue offset the slave holds a message
    for, and it holds the same last offset (a slave that started at the master's last segment
    has nothing, or fillers, before)."""
    for q in range(QUEUES):
        m, s = cq_units(master, q), cq_units(slave, q)
        if len(m) != len(s):
            return False
        real = (s["size"] != FILLER_SIZE) & (s["size"] != 0)
        if not real.any() or not np.array_equal(m[real], s[real]):
            return False
    return True


def assert_same_log(master: Path, slave: Path, *, whole: bool) -> None:
    m, s = segment_files(master), segment_files(slave)
    if whole:
        assert list(s) == list(m)
    else:
        assert list(s) == list(m)[len(m) - len(s):]
    for name, data in s.items():
        assert data == m[name], f"segment {name} differs"


# -- catching up -------------------------------------------------------------------------------
def test_a_new_slave_starts_at_the_masters_last_segment_and_follows(tmp_path, procs):
    config = base_config()
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    assert master.ask("batch 800 300").startswith("DONE PUT_OK")  # about 4 segments
    end = master.end()
    assert end > 3 * SEG
    slave = Slave(tmp_path / "slave", config, master.address, tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    wait_for(lambda: slave.offset() == end, "the slave caught up", logs=logs)
    assert sorted(segment_files(tmp_path / "slave")) == [f"{end - end % SEG:020d}"]
    assert_same_log(tmp_path / "master", tmp_path / "slave", whole=False)
    # It follows what comes next, segment after segment.
    assert master.ask("batch 600 300").startswith("DONE PUT_OK")
    end = master.end()
    wait_for(lambda: slave.offset() == end, "the slave followed", logs=logs)
    assert_same_log(tmp_path / "master", tmp_path / "slave", whole=False)
    wait_for(lambda: same_queues(tmp_path / "master", tmp_path / "slave"),
             "the slave's consume queues", logs=logs)
    # Lag is visible on both sides: /metrics and /healthz of the slave, stats of both.
    assert slave.metric("mqstore_replication_master_connected") == 1
    assert slave.metric("mqstore_replication_master_offset_bytes") == end
    assert slave.metric("mqstore_replication_lag_bytes") == 0
    assert slave.health()[0] == 200
    wait_for(lambda: (read_status(tmp_path / "slave") or {}).get("offset") == end
             and [s["ack_offset"] for s in (read_status(tmp_path / "master") or {})
                  .get("slaves", [])] == [end], "replication.json of both", logs=logs)
    stats = mqstore_json("stats", tmp_path / "slave")["replication"]  # the command, once
    assert stats["live"] and stats["connected"] and stats["lag_bytes"] == 0
    assert stats["offset"] == stats["master_offset"] == end
    (listed,) = store_stats(str(tmp_path / "master"), load_config())["replication"]["slaves"]
    assert listed["ack_offset"] == end and listed["lag_bytes"] == 0
    # The master goes: the slave's health says so.
    master.close()
    wait_for(lambda: slave.health()[0] == 503, "the slave noticed", logs=logs)
    code, body = slave.health()
    assert any("lost" in p and master.address in p for p in body["problems"]), body
    slave.stop()
    assert "store closed cleanly" in slave.log_path.read_text()


def test_a_slave_far_behind_catches_up_through_cuts_and_a_sigkill(tmp_path, procs):
    """The whole log (first_segment), through a proxy that cuts the connection mid-frame
    from either side, and the slave SIGKILLed mid-stream: it resumes from its own recovered
    end; nothing is duplicated or skipped (byte-identical logs, identical queue units)."""
    config = base_config(ha_new_slave_from="first_segment")
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    for _ in range(3):
        assert master.ask("batch 800 300").startswith("DONE PUT_OK")  # about 12 segments
    proxy = CuttingProxy(master.address)
    # Cut mid-frame (after an odd number of the master's bytes), from the master's side and
    # from the slave's in turn: first while the slave catches up, then while it follows.
    cuts = [("master", 50_001), ("slave", 120_007), ("master", 7_777), ("slave", 1)]
    proxy.cut(*cuts[0])
    slave = Slave(tmp_path / "slave", config, proxy.address, tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    master.send("stream 200 10")
    for made, nxt in enumerate(cuts[1:] + [None], start=1):
        wait_for(lambda: proxy.connections > made and proxy.pending is None,
                 f"cut {made} made and the slave connected again", logs=logs)
        if nxt is not None:
            proxy.cut(*nxt)
    wait_for(lambda: slave.offset() > 4 * SEG, "the slave well under way", logs=logs)
    slave.kill()  # mid-stream: the master is still putting
    slave.start()
    end = int(master.ask("halt").split()[1])
    wait_for(lambda: slave.offset() == end, "the restarted slave caught up", logs=logs)
    assert master.end() == end
    assert_same_log(tmp_path / "master", tmp_path / "slave", whole=True)
    wait_for(lambda: same_queues(tmp_path / "master", tmp_path / "slave"),
             "the slave's consume queues", logs=logs)
    for q in range(QUEUES):  # from offset 0: every unit the master has
        assert not (cq_units(tmp_path / "slave", q)["size"] == FILLER_SIZE).any()
    log = slave.log_path.read_text()
    assert "connection to master" in log and "dialling again" in log
    proxy.close()


# -- SYNC_MASTER ---------------------------------------------------------------------------------
def test_every_put_ok_of_a_sync_master_is_on_the_slave_after_the_masters_sigkill(tmp_path, procs):
    config = base_config(role="sync_master")
    config["flush"] = {"sync_timeout_ms": 1500}
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    master.send("put 1 100")
    assert master.line().startswith("SLAVE_NOT_AVAILABLE "), "no slave yet"
    assert master.line() == "DONE"
    slave = Slave(tmp_path / "slave", config, master.address, tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    wait_for(lambda: slave.metric("mqstore_replication_master_connected") == 1, "connected",
             logs=logs)
    # The slave says it is connected once it sent its first report; the master counts it
    # once that report is read.
    wait_for(lambda: master.ask("batch 1 10").startswith("DONE PUT_OK "),
             "the master counting the slave", logs=logs)
    # A slave that stops acknowledging (stopped, its connection still open): the put times
    # out, and is stored all the same.
    os.killpg(slave.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: all_threads_stopped(slave.proc.pid), "the slave stopped", logs=logs)
        master.send("put 1 100")
        status, phys, size = master.line().split()
        assert status == "FLUSH_SLAVE_TIMEOUT"
        assert master.line() == "DONE"
    finally:
        os.killpg(slave.proc.pid, signal.SIGCONT)
    acked = []
    master.send("put 400 700")
    while len(acked) < 150:  # the slave, resumed, may still time out the first puts
        status, phys, size = master.line().split()
        assert status in ("PUT_OK", "FLUSH_SLAVE_TIMEOUT"), status
        if status == "PUT_OK":
            acked.append((int(phys), int(size)))
    master.kill()  # mid-stream, puts still under way
    while True:  # what it answered before it died counts too
        try:
            line = master.lines.get(timeout=1)
        except queue.Empty:
            break
        if not line or line == "DONE":
            break
        status, phys, size = line.split()
        if status == "PUT_OK":
            acked.append((int(phys), int(size)))
    mlog, slog = segment_files(tmp_path / "master"), segment_files(tmp_path / "slave")
    for phys, size in acked:
        name = f"{phys - phys % SEG:020d}"
        at = phys % SEG
        assert name in slog, f"PUT_OK at {phys} is not on the slave"
        assert slog[name][at:at + size] == mlog[name][at:at + size], phys
    wait_for(lambda: slave.health()[0] == 503, "the slave noticed its master is gone",
             logs=logs)


# -- faults ------------------------------------------------------------------------------------
def test_a_diverging_slave_is_refused_and_changes_nothing(tmp_path, procs):
    from mqstore import Message, MessageBatch, MessageStore, load_config
    config = base_config()
    thread = load_config(overrides={**config, "dispatch": {"worker": "thread"},
                                    "flush": {"worker": "thread"}})

    def put(root, bodies):
        with MessageStore.open(root, config=thread) as store:
            store.put_batch(MessageBatch(topic="orders", bodies=bodies,
                                         queue_ids=[i % 4 for i in range(len(bodies))]))
    common = [b"common %d" % i * 9 for i in range(300)]
    put(tmp_path / "master", common + [b"the master's record"] + [b"more"] * 50)
    put(tmp_path / "mismatched", common + [b"a record the master does not have, longer"])
    put(tmp_path / "ahead", common + [b"the master's record"] + [b"more"] * 80)
    with MessageStore.open(tmp_path / "mismatched", config=thread) as s:
        assert s.put(Message("orders", b"x")).status.stored  # nothing special: a plain store
    before = {name: segment_files(tmp_path / name) for name in ("mismatched", "ahead")}
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    end = master.end()
    for name, says in (("mismatched", "not a record of this log|no record starts|physical "
                                      "offset field"),
                       ("ahead", "before sending a frame")):
        slave = Slave(tmp_path / name, config, master.address, tmp_path / f"{name}.log")
        procs.append(slave)
        logs = (slave.log_path, master.log_path)
        wait_for(lambda: re.search(says, slave.log_path.read_text()), f"{name} refused",
                 logs=logs)
        wait_for(lambda: slave.health()[0] == 503, f"{name}'s health", logs=logs)
        assert any("lost" in p for p in slave.health()[1]["problems"])
        slave.stop()
        assert segment_files(tmp_path / name) == before[name], f"{name} changed"
    text = master.log_path.read_text()
    assert "beyond this master's end" in text and "diverge" in text
    assert master.end() == end  # the master goes on
    master.close()


def test_garbage_truncated_frames_and_port_scanners_crash_neither_side(tmp_path, procs):
    config = base_config()
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    assert master.ask("batch 400 300").startswith("DONE PUT_OK")
    end = master.end()
    host, port = master.address.rsplit(":", 1)
    for payload in (b"", b"\xff" * 8, os.urandom(4096), b"GET / HTTP/1.0\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            if payload:
                sock.sendall(payload)
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # still serving
        sock.sendall(encode_report(end))
        assert read_exact(sock, 12) == encode_header(end, 0)
    assert master.ask("batch 10 100").startswith("DONE PUT_OK")
    end = master.end()
    # A slave fed by a master that misbehaves: garbage, then a frame cut short by a closed
    # connection, then the log in frames cut mid-record; it ends identical to the master's.
    log = b"".join(segment_files(tmp_path / "master").values())[:end]
    fake = FakeMaster(log)
    slave = Slave(tmp_path / "slave", config, fake.address, tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    wait_for(lambda: fake.done, "the fake master's script", logs=logs)
    wait_for(lambda: slave.offset() == end, "the slave caught up with the fake master",
             logs=logs)
    assert_same_log(tmp_path / "master", tmp_path / "slave", whole=True)
    assert fake.reports[:3] == [0, 0, 0]  # nothing of the garbage or the cut frame written
    assert 0 < fake.resumed_from < end and fake.reports[3] == fake.resumed_from
    text = slave.log_path.read_text()
    assert "breaks the HA protocol" in text
    assert slave.health()[0] == 200
    slave.stop()
    master.close()


# -- test network parts --------------------------------------------------------------------------
class FakeMaster:
    """Plays a master from a copy of its log: garbage to the first connection, a frame cut
    short to the second, a stream cut mid-record to the third, the rest to the fourth."""

    def __init__(self, log: bytes) -> None:
        self.log = log
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.reports: list[int] = []
        self.resumed_from = -1
        self.done = False
        threading.Thread(target=self._script, daemon=True).start()

    def _report(self, sock) -> int:
        self.reports.append(int.from_bytes(read_exact(sock, 8), "big"))
        return self.reports[-1]

    def _frames(self, begin: int, end: int) -> bytes:
        out, pos = b"", begin
        while pos < end:
            stop = min(end, pos + 32768, pos - pos % SEG + SEG)
            out += encode_header(pos, stop - pos) + self.log[pos:stop]
            pos = stop
        return out

    def _script(self) -> None:
        with self.server.accept()[0] as sock:
            self._report(sock)
            sock.sendall(b"\x80" + os.urandom(4095))  # a header with a negative offset
            time.sleep(0.5)
        with self.server.accept()[0] as sock:
            self._report(sock)
            sock.sendall(encode_header(0, 1000) + self.log[:500])  # the rest never comes
        with self.server.accept()[0] as sock:
            self._report(sock)
            cut = len(self.log) // 2 + 77  # inside a record
            sock.sendall(self._frames(0, cut))
            time.sleep(0.5)
        with self.server.accept()[0] as sock:
            self.resumed_from = self._report(sock)
            sock.sendall(self._frames(self.resumed_from, len(self.log)))
            self.done = True
            end = len(self.log)
            deadline = time.monotonic() + WAIT_S
            while self.reports[-1] < end and time.monotonic() < deadline:
                self._report(sock)
            while time.monotonic() < deadline:  # heartbeats until the slave leaves
                try:
                    sock.sendall(encode_header(end, 0))
                    self._report(sock)
                except OSError:
                    return
                time.sleep(0.2)
