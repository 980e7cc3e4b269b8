"""The HA port against strangers, between real processes on 127.0.0.1 (default worker
processes): a master (``replica_proc.py``) told of its slaves by address (``server.ha_allow``,
as RocketMQ's slaves are) or by a shared secret (mqstore's handshake), strangers that play a
slave from this host's other loopback addresses or from the slave's own, and ``mqstore serve``
slaves. A stranger reads none of the log, acknowledges nothing a put waits for, and cannot
crowd a slave out; slaves speaking the handshake over TLS replicate, and the wrong ones are
told why."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from mqstore.format import ha_hello as hello
from mqstore.format.ha_frame import encode_report
from cli_support import mqstore
from replication_procs import Master, Slave, base_config, wait_for

pytestmark = [pytest.mark.usefixtures("no_plugin_env", "watchdog")]
SECRET = b"f3a1c0de5e2b7789a04d11c9e6b2f0aa"
STRANGE = "127.0.0.2"  # another host, as far as the master can tell


def told(mode: str, tmp_path: Path) -> tuple[dict, dict, list[str]]:
    """The master's and the slave's ``server`` keys for ``mode``, and where strangers dial
    from (the slave itself dials from 127.0.0.1)."""
    if mode == "address":
        return {"ha_allow": ["127.0.0.1/32"]}, {}, [STRANGE]
    path = tmp_path / "ha.secret"
    path.write_bytes(SECRET)
    return {"ha_secret_file": str(path)}, {"ha_secret_file": str(path)}, ["127.0.0.1", STRANGE]


def with_server(config: dict, **server) -> dict:
    return {**config, "server": {**config["server"], **server}}


class Stranger:
    """Plays a slave it is not, over and over, from ``source``: ``classic`` reports ``first``
    and then acknowledges the end of every frame it is sent; ``hello`` first tries the
    handshake with a wrong secret; ``stall`` sends half a handshake and waits. It dials
    again ``pause`` seconds after the master closes it. Counts connections and log bytes."""

    def __init__(self, target: str, source: str, how: str = "classic", first: int = 1,
                 pause: float = 0.05) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.source, self.how, self.first = (host, int(port)), source, how, first
        self.pause = pause
        self.connections = self.frames = self.log_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(self.target, timeout=1.0,
                                              source_address=(self.source, 0)) as sock:
                    self.connections += 1
                    self._play(sock)
            except OSError:
                pass
            self._stop.wait(self.pause)

    def _recv_exact(self, sock, n: int) -> bytes:
        out = b""
        while len(out) < n:
            try:
                chunk = sock.recv(n - len(out))
            except TimeoutError:
                if self._stop.is_set():
                    raise ConnectionError("stopped") from None
                continue
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def _play(self, sock) -> None:
        if self.how == "stall":
            sock.sendall(hello.encode_open()[:5])
            self._recv_exact(sock, 1)
            return
        if self.how == "hello":
            opened = hello.encode_open()
            sock.sendall(opened)
            head = self._recv_exact(sock, hello.HEADER_BYTES)
            challenge = head + self._recv_exact(sock, hello.parse_header(head).length)
            sock.sendall(hello.encode_proof(1, bytes(32), b"a guess, not the secret",
                                            opened + challenge))
            head = self._recv_exact(sock, hello.HEADER_BYTES)
            self._recv_exact(sock, hello.parse_header(head).length)  # the result
        sock.sendall(encode_report(self.first))
        while True:  # acknowledge whatever comes, as far as it goes
            offset, size = struct.unpack(">qi", self._recv_exact(sock, 12))
            self._recv_exact(sock, size)
            self.frames += 1
            self.log_bytes += size
            sock.sendall(encode_report(offset + size))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def strangers():
    crowd: list[Stranger] = []
    yield crowd
    for s in crowd:
        s.stop()


def dialled(crowd, at_least: int) -> bool:
    return sum(s.connections for s in crowd) >= at_least


@pytest.mark.parametrize("mode", ["address", "secret"])
def test_a_stranger_reporting_offset_1_gets_no_log_bytes(tmp_path, procs, strangers, mode):
    master_keys, _, sources = told(mode, tmp_path)
    master = Master(tmp_path / "master", with_server(base_config(), **master_keys),
                    tmp_path / "master.log")
    procs.append(master)
    assert master.ask("batch 400 300").startswith("DONE PUT_OK")
    hows = ["classic"] + (["hello"] if mode == "secret" else [])
    strangers += [Stranger(master.address, source, how) for source in sources for how in hows]
    # Refused and dialling again, or (were it taken for a slave) sent the log.
    wait_for(lambda: all(s.connections >= 3 or s.log_bytes for s in strangers),
             "strangers dialled again", logs=[master.log_path])
    assert [s.log_bytes for s in strangers] == [0] * len(strangers)
    assert "refused" in master.log_path.read_text()


@pytest.mark.parametrize("mode", ["address", "secret"])
def test_a_stranger_acknowledging_everything_does_not_turn_slave_not_available_into_put_ok(
        tmp_path, procs, strangers, mode):
    master_keys, _, sources = told(mode, tmp_path)
    config = with_server(base_config(role="sync_master"), **master_keys)
    config["flush"] = {"sync_timeout_ms": 1500}
    master = Master(tmp_path / "master", config, tmp_path / "master.log")
    procs.append(master)
    assert master.ask("batch 50 300").startswith("DONE SLAVE_NOT_AVAILABLE")
    hows = ["classic"] + (["hello"] if mode == "secret" else [])
    strangers += [Stranger(master.address, source, how, first=0) for source in sources
                  for how in hows]
    # Refused and dialling again, or (were it taken for a slave) acknowledging frames.
    wait_for(lambda: all(s.connections >= 3 or s.frames for s in strangers),
             "strangers at work", logs=[master.log_path])
    master.send("put 100 300")
    statuses = [master.line().split()[0] for _ in range(100)]
    assert master.line() == "DONE"
    assert statuses == ["SLAVE_NOT_AVAILABLE"] * 100
    assert [s.log_bytes for s in strangers] == [0] * len(strangers)


@pytest.mark.parametrize("mode", ["address", "secret"])
def test_strangers_crowding_the_port_do_not_lock_the_slave_out(tmp_path, procs, strangers,
                                                                mode):
    master_keys, slave_keys, _ = told(mode, tmp_path)
    config = base_config(role="sync_master")
    config["flush"] = {"sync_timeout_ms": 5000}
    master = Master(tmp_path / "master", with_server(config, **master_keys),
                    tmp_path / "master.log")
    procs.append(master)
    assert master.ask("batch 200 300").startswith("DONE SLAVE_NOT_AVAILABLE")
    # More than the 16 slots a master has, all at work before the slave comes: with a
    # secret, also handshakes left half done (20 of them, for 16 places) from two hosts, and
    # refused ones from the slave's own address.
    crowd = [("classic", STRANGE)] * 24 if mode == "address" else (
        [("stall", STRANGE), ("stall", "127.0.0.3")] * 10
        + [("classic", "127.0.0.1"), ("hello", "127.0.0.1")] * 4)
    strangers += [Stranger(master.address, source, how, first=0, pause=0.1)
                  for how, source in crowd]
    wait_for(lambda: dialled(strangers, 2 * len(crowd)), "strangers crowding",
             logs=[master.log_path])
    slave = Slave(tmp_path / "slave", with_server(config, **slave_keys), master.address,
                  tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    wait_for(lambda: slave.health()[0] == 200 and slave.offset() == master.end(),
             "the slave connected and caught up", logs=logs)
    for _ in range(3):  # the crowd goes on dialling; the slave keeps replicating
        crowded = sum(s.connections for s in strangers)
        master.send("put 20 300")
        statuses = [master.line().split()[0] for _ in range(20)]
        assert master.line() == "DONE"
        assert statuses == ["PUT_OK"] * 20  # the slave's acknowledgements, no one else's
        end = master.end()
        wait_for(lambda: slave.offset() == end and dialled(strangers, crowded + len(crowd)),
                 "the slave followed, strangers still dialling", logs=logs)
        assert slave.health()[0] == 200
        assert slave.metric("mqstore_replication_master_connected") == 1
    assert [s.log_bytes for s in strangers] == [0] * len(strangers)


def test_mqstore_slaves_over_tls_with_the_secret_replicate_and_impostors_are_told_why(
        tmp_path, procs, ha_certs):
    secret = tmp_path / "ha.secret"
    secret.write_bytes(SECRET)
    config = base_config(role="sync_master")
    config["flush"] = {"sync_timeout_ms": 5000}
    master = Master(tmp_path / "master", with_server(
        config, ha_secret_file=str(secret), **ha_certs["master"]), tmp_path / "master.log")
    procs.append(master)
    slave = Slave(tmp_path / "slave", with_server(config, ha_secret_file=str(secret),
                                                  **ha_certs["slave"]),
                  master.address, tmp_path / "slave.log")
    procs.append(slave)
    logs = (slave.log_path, master.log_path)
    wait_for(lambda: slave.health()[0] == 200, "the slave connected", logs=logs)
    # The slave says it is connected once it sent its first report; the master counts it
    # once that report is read.
    wait_for(lambda: master.ask("batch 1 10").startswith("DONE PUT_OK "),
             "the master counting the slave", logs=logs)
    master.send("put 30 500")
    assert [master.line().split()[0] for _ in range(30)] == ["PUT_OK"] * 30
    assert master.line() == "DONE"
    end = master.end()
    wait_for(lambda: slave.offset() == end, "the slave caught up", logs=logs)
    assert "connected (handshake, shared secret over TLS (commonName=slave))" in \
        master.log_path.read_text()
    wrong = tmp_path / "wrong.secret"
    wrong.write_bytes(b"0" * 32)
    impostors = {
        "rogue": (with_server(config, ha_secret_file=str(secret), **ha_certs["rogue"]),
                  "certificate verify failed"),
        "wrong": (with_server(config, ha_secret_file=str(wrong), **ha_certs["slave"]),
                  "the master refused this slave (refused): the slave's proof does not match"),
        "plain": (with_server(config, ha_secret_file=str(secret)),
                  "did not answer mqstore's handshake")}
    for name, (cfg, says) in impostors.items():
        other = Slave(tmp_path / name, cfg, master.address, tmp_path / f"{name}.log")
        procs.append(other)
        wait_for(lambda: other.health()[0] == 503
                 and any(says in p for p in other.health()[1]["problems"]),
                 f"{name} refused, saying why", logs=(other.log_path, master.log_path))
        assert other.offset() == 0
        other.stop()
    assert slave.health()[0] == 200


def test_serve_refuses_a_master_beyond_loopback_told_of_no_slave(tmp_path):
    config = tmp_path / "master.yaml"
    config.write_text('{"store": {"role": "sync_master"}, "server": {"ha_listen": '
                      '"0.0.0.0:0", "metrics_listen": "127.0.0.1:0"}}')
    began = time.monotonic()
    proc = mqstore("serve", "-c", config, "--root", tmp_path / "store", check=None)
    assert proc.returncode != 0
    assert "nothing says which peers are slaves" in proc.stderr
    assert "server.ha_allow" in proc.stderr and "server.ha_secret_file" in proc.stderr
    assert not (tmp_path / "store").exists()  # refused before anything was made
    assert time.monotonic() - began < 60
