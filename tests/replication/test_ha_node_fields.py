"""What nodes say of themselves in mqstore's HA handshake (NOTE [ Node fields ]) and in status
frames, byte for byte, and what a master does with it on the wire: a probe answered without a
slave slot, a slave with a newer epoch refused and the master fenced, the confirm offset told
to slaves as it moves."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct

import pytest

from mqstore import Message, MessageBatch, testing
from mqstore.format import ha_hello as hello
from mqstore.format.epoch_file import EpochEntry
from mqstore.format.ha_frame import FrameDecoder, FrameError, encode_status
from mqstore.message import PutStatus

SEG = 65536
WAIT_S = 10.0
SECRET = b"0123456789abcdef0123456789abcdef"
NONCE_M, NONCE_S = bytes(range(32)), bytes(range(32, 64))
FAST = {"ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000}
SLAVE = hello.NodeInfo(hello.ROLE_SLAVE, 4096, -1, (EpochEntry(1, 0), EpochEntry(2, 1024)))
MASTER = hello.NodeInfo(hello.ROLE_MASTER, 9000, 8800, (EpochEntry(1, 0),), "10.0.0.1:8081")


def test_node_fields_bytes():
    assert hello.encode_fields(SLAVE) == bytes.fromhex(
        "01" "0012" "00" "00" "0000000000001000" "ffffffffffffffff"   # node: slave, end 4096
        "02" "0018" "00000001" "0000000000000000" "00000002" "0000000000000400"  # epochs
        "03" "0000")                                                  # endpoint: none
    probe = MASTER._replace(probe=True)
    assert hello.encode_fields(probe, epochs=False, endpoint=False) == bytes.fromhex(
        "01" "0012" "01" "01" "0000000000002328" "0000000000002260")  # master, probe flag
    for info in (SLAVE, MASTER, probe):
        assert hello.decode_fields(hello.encode_fields(info)) == info


def test_a_proof_and_a_result_carry_fields_before_their_mac():
    opened = hello.encode_open()
    challenge = hello.encode_challenge(1, hello.AUTH_HMAC, NONCE_M)
    fields = hello.encode_fields(SLAVE)
    proof = hello.encode_proof(1, NONCE_S, SECRET, opened + challenge, fields)
    head = bytes.fromhex("e14d5148" "03" "01") + struct.pack(">H", 64 + len(fields))
    head += NONCE_S + fields
    assert proof == head + hmac.new(SECRET, b"mqstore-ha slave proof" + opened + challenge
                                    + head, hashlib.sha256).digest()
    body = proof[8:]
    assert hello.decode_proof(body) == hello.Proof(NONCE_S, proof[-32:])  # as version 1 reads
    assert hello.decode_fields(hello.proof_fields(body)) == SLAVE
    result = hello.encode_result(1, hello.ACCEPTED, "", SECRET, opened + challenge + proof,
                                 hello.encode_fields(MASTER))
    assert hello.decode_result(result[8:]).status == hello.ACCEPTED
    assert hello.decode_fields(hello.result_fields(result[8:])) == MASTER
    # A peer that sends no fields (an older mqstore) says nothing; a later tag is skipped.
    assert hello.decode_fields(b"") is None
    assert hello.decode_fields(b"\x09\x00\x02hi") is None
    assert hello.decode_fields(b"\x09\x00\x02hi" + hello.encode_fields(SLAVE)) == SLAVE


@pytest.mark.parametrize("data, says", [
    (b"\x01\x00", "left where a field's 3-byte tag and length belong"),
    (b"\x01\x00\x12\x00", "says 18 bytes; 1 follow"),
    (b"\x01\x00\x01\x00", "node field of 1 bytes"),
    (b"\x02\x00\x05abcde", "epochs field of 5 bytes"),
    (b"\x02\x00\x18" + struct.pack(">IQIQ", 2, 0, 1, 10), "strictly increase"),
    (b"\x03\x00\x01\xff", "not UTF-8"),
])
def test_fields_breaking_their_layout_are_refused(data, says):
    with pytest.raises(hello.HelloError, match=says):
        hello.decode_fields(data)


def test_status_frames_reach_only_a_slave_that_asked_for_them():
    fields = hello.encode_fields(MASTER, epochs=False)
    frame = encode_status(fields)
    assert frame[:12] == bytes.fromhex("ffffffffffffffff") + struct.pack(">i", len(fields))
    (got,) = FrameDecoder(status_frames=True).feed(frame)
    assert got == (-1, fields)
    with pytest.raises(FrameError, match="offset -1"):  # a classic slave: garbage
        FrameDecoder().feed(frame)
    with pytest.raises(FrameError, match="offset -2"):
        FrameDecoder(status_frames=True).feed(struct.pack(">qi", -2, 4) + b"abcd")


# -- on the wire ---------------------------------------------------------------------------
@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "ha.secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


@pytest.fixture
def master(make_store, tmp_path, secret_file):
    s = make_store({"commit_log": {"segment_bytes": SEG}, "store": FAST,
                    "server": {"ha_listen": "127.0.0.1:0", "ha_secret_file": secret_file}},
                   root=tmp_path / "master")
    s.put_batch(MessageBatch(topic="ha", bodies=[b"x%d" % i for i in range(50)]))
    s.replication.start()
    return s


def dial(store) -> socket.socket:
    host, port = store.replication.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def read_exact(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def exchange(sock, node: hello.NodeInfo) -> tuple[hello.Result, hello.NodeInfo | None]:
    opened = hello.encode_open()
    sock.sendall(opened)
    head = read_exact(sock, 8)
    challenge = head + read_exact(sock, hello.parse_header(head).length)
    sock.sendall(hello.encode_proof(1, NONCE_S, SECRET, opened + challenge,
                                    hello.encode_fields(node)))
    head = read_exact(sock, 8)
    body = read_exact(sock, hello.parse_header(head).length)
    return hello.decode_result(body), hello.decode_fields(hello.result_fields(body))


def test_a_probe_is_told_the_masters_state_and_takes_no_slave_slot(master):
    with dial(master) as sock:
        result, said = exchange(sock, hello.NodeInfo(hello.ROLE_MASTER, 0, probe=True))
        assert result.status == hello.ACCEPTED
        end = master.max_phys_offset  # every put so far answered PUT_OK
        assert said == hello.NodeInfo(hello.ROLE_MASTER, end, end, (EpochEntry(1, 0),), "")
        sock.settimeout(WAIT_S)
        assert sock.recv(1) == b""  # answered, then closed
    assert master.replication.status()["slaves"] == [] and master.role_state.writable


def test_a_slave_with_a_newer_epoch_is_refused_and_the_master_is_fenced(master):
    assert master.put(Message("ha", b"before")).status is PutStatus.PUT_OK
    newer = hello.NodeInfo(hello.ROLE_SLAVE, 0, -1, (EpochEntry(1, 0), EpochEntry(2, 100)))
    with dial(master) as sock:
        result, said = exchange(sock, newer)
    assert result.status == hello.REFUSED
    assert "holds epoch 2, newer than this master's 1" in result.reason
    assert said.role == hello.ROLE_FENCED
    put = master.put(Message("ha", b"after"))
    assert put.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "newer than this master's 1" in put.error


def test_a_slave_hears_the_confirm_offset_as_puts_are_answered(master):
    with dial(master) as sock:
        result, said = exchange(sock, hello.NodeInfo(hello.ROLE_SLAVE, 0))
        assert result.status == hello.ACCEPTED and said.confirmed == master.max_phys_offset
        sock.sendall(struct.pack(">q", master.max_phys_offset))
        put = master.put(Message("ha", b"acknowledged"))
        end = put.phys_offset + put.size
        decoder, heard = FrameDecoder(status_frames=True), None
        while heard is None or heard.confirmed != end:
            for offset, body in decoder.feed(sock.recv(65536)):
                if offset == -1:
                    heard = hello.decode_fields(body, heard)
        assert heard.role == hello.ROLE_MASTER and heard.end >= end
    assert testing.wait_for(lambda: master.replication.acks.confirmed == end, timeout=WAIT_S)
