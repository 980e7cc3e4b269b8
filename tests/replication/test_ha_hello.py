"""mqstore's HA handshake byte for byte (``format.ha_hello``), and who a master admits, speaking
to bare sockets on 127.0.0.1: RocketMQ's classic slaves by address, mqstore's slaves by a
shared secret or TLS, strangers refused with none of the log; and what a slave does facing a
master that cannot prove itself."""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import struct
import threading

import pytest

from mqstore import MessageBatch, load_config, testing
from mqstore.errors import ConfigError
from mqstore.format import ha_hello as hello
from mqstore.format.ha_frame import FrameError, ReportDecoder, encode_header, encode_report
from mqstore.format.ha_hello import HelloError
from mqstore.replication.master import MAX_PENDING

from replication_support import log_bytes

SEG = 65536
WAIT_S = 10.0
SECRET = b"0123456789abcdef0123456789abcdef"
NONCE_M, NONCE_S = bytes(range(32)), bytes(range(32, 64))
FAST = {"ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000}

pytestmark = pytest.mark.loops("thread")


# -- the layouts -------------------------------------------------------------------------------
def test_an_open_is_one_negative_long_no_offset_report_can_be():
    opened = hello.encode_open()
    assert opened == bytes.fromhex("e14d5148" "01" "01" "0000")
    (as_report,) = struct.unpack(">q", opened)
    assert as_report < 0  # what a RocketMQ master reads: no commit log ends there
    with pytest.raises(FrameError, match="offset report -"):  # and an older mqstore master
        ReportDecoder().feed(opened)
    assert hello.is_hello(opened) and not hello.is_hello(encode_report(1 << 62))


def test_challenge_proof_and_result_bytes():
    opened = hello.encode_open()
    challenge = hello.encode_challenge(1, hello.AUTH_HMAC, NONCE_M)
    assert challenge == bytes.fromhex("e14d5148" "02" "01" "0024" "01" "000000") + NONCE_M
    proof = hello.encode_proof(1, NONCE_S, SECRET, opened + challenge)
    head = bytes.fromhex("e14d5148" "03" "01" "0040") + NONCE_S
    mac = hmac.new(SECRET, b"mqstore-ha slave proof" + opened + challenge + head,
                   hashlib.sha256).digest()
    assert proof == head + mac
    assert mac.hex() == ("aba9d6bc763b6a61218160c38777a18277b134c977cae0b2232ecbb9e0b994f1")
    result = hello.encode_result(1, hello.ACCEPTED, "", SECRET, opened + challenge + proof)
    head = bytes.fromhex("e14d5148" "04" "01" "0024" "00" "00" "0000")
    assert result == head + hmac.new(SECRET, b"mqstore-ha master proof" + opened + challenge
                                     + proof + head, hashlib.sha256).digest()
    assert result[-32:].hex() == ("90865f90684aa2f0aacb49d2152dea4a"
                                  "42b3efcdc9969f288bff2fa043824edf")
    # Without a secret (TLS proves the slave), and for every refusal: zeros where the mac goes.
    assert hello.encode_proof(1, NONCE_S, None, b"")[-32:] == bytes(32)
    assert hello.encode_result(1, hello.REFUSED, "no", SECRET, b"") == bytes.fromhex(
        "e14d5148" "04" "01" "0026" "01" "00" "0002") + b"no" + bytes(32)


def test_readers_take_known_fields_and_leave_added_ones():
    """A later version adds fields between a body's fields and its mac: this one reads on."""
    assert hello.decode_challenge(bytes.fromhex("01000000") + NONCE_M + b"later") == \
        hello.Challenge(hello.AUTH_HMAC, NONCE_M)
    mac = bytes(range(100, 132))
    assert hello.decode_proof(NONCE_S + b"epoch fields" + mac) == hello.Proof(NONCE_S, mac)
    body = bytes.fromhex("00 00 0002") + b"ok" + b"\x00\x00\x00\x07epoch" + mac
    assert hello.decode_result(body) == hello.Result(hello.ACCEPTED, "ok", mac)


@pytest.mark.parametrize("data, says", [
    (bytes.fromhex("0000000000000001"), "not an mqstore HA handshake message"),
    (bytes.fromhex("e14d5148" "09" "01" "0000"), "kind 9"),
    (bytes.fromhex("e14d5148" "01" "00" "0000"), "version 0"),
    (bytes.fromhex("e14d5148" "03" "01" "ffff"), "length 65535"),
])
def test_a_header_outside_the_protocol_is_refused(data, says):
    with pytest.raises(HelloError, match=says):
        hello.parse_header(data)


@pytest.mark.parametrize("decode, body, says", [
    (hello.decode_challenge, b"\x01\x00\x00\x00" + bytes(31), "at least 36"),
    (hello.decode_challenge, b"\x07\x00\x00\x00" + NONCE_M, "auth 7"),
    (hello.decode_proof, bytes(63), "at least 64"),
    (hello.decode_result, bytes.fromhex("01 00 0010") + b"short" + bytes(32), "does not fit"),
])
def test_short_or_unknown_bodies_are_refused(decode, body, says):
    with pytest.raises(HelloError, match=says):
        decode(body)


# -- a master on the wire ----------------------------------------------------------------------
@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "ha.secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


@pytest.fixture
def master(make_store, tmp_path):
    """``master(**server)``: a store with about 4.5 segments, listening on a free port of
    127.0.0.1 with the ``server.ha_*`` keys given."""
    def make(**server):
        s = make_store({"commit_log": {"segment_bytes": SEG}, "store": FAST,
                        "server": {"ha_listen": "127.0.0.1:0", **server}},
                       root=tmp_path / "master")
        bodies = [b"%d" % i * (1 + i % 97) for i in range(1500)]
        s.put_batch(MessageBatch(topic="ha", bodies=bodies, queue_ids=[i % 3 for i in range(1500)]))
        s.replication.start()
        return s
    return make


def dial(store, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the store's HA port from ``source`` (any 127.x address is this host)."""
    host, port = store.replication.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S, source_address=(source, 0))


def read_exact(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def read_message(sock) -> tuple[hello.Header, bytes]:
    head = read_exact(sock, hello.HEADER_BYTES)
    header = hello.parse_header(head)
    return header, head + read_exact(sock, header.length)


def read_frame(sock) -> tuple[int, bytes]:
    offset, size = struct.unpack(">qi", read_exact(sock, 12))
    return offset, read_exact(sock, size)


def everything_until_closed(sock, timeout: float = WAIT_S) -> bytes:
    """What the peer sends until it closes (AssertionError if it does not within timeout)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def handshake(sock, secret: bytes | None) -> hello.Result:
    """A slave's side, by hand: open, prove with ``secret``, and the master's result (its mac
    checked when accepted with a secret)."""
    opened = hello.encode_open()
    sock.sendall(opened)
    header, challenge = read_message(sock)
    if header.kind == hello.RESULT:
        return hello.decode_result(challenge[8:])
    proof = hello.encode_proof(1, NONCE_S, secret, opened + challenge)
    sock.sendall(proof)
    _, answer = read_message(sock)
    result = hello.decode_result(answer[8:])
    if result.status == hello.ACCEPTED and secret is not None:
        assert result.mac == hello.mac(secret, hello.MASTER_LABEL,
                                       opened + challenge + proof + answer[:-32])
    return result


def acked(store) -> list[int]:
    return list(store.replication.acks.slaves().values())


def test_a_slave_proving_the_secret_is_sent_the_log_byte_for_byte(master, secret_file):
    m = master(ha_secret_file=secret_file)
    end = m.max_phys_offset
    with dial(m) as sock:
        assert handshake(sock, SECRET).status == hello.ACCEPTED
        sock.sendall(encode_report(SEG + 1000))  # then RocketMQ's protocol, unchanged
        offset, body = read_frame(sock)
        assert (offset, body) == (SEG + 1000, log_bytes(m, SEG + 1000, SEG + 1000 + 32768))
        assert testing.wait_for(lambda: acked(m) == [SEG + 1000], timeout=WAIT_S)
        (slave,) = m.replication.status()["slaves"]
        assert slave["admitted"] == "handshake, shared secret"
        sock.sendall(encode_report(end))
        assert testing.wait_for(lambda: acked(m) == [end], timeout=WAIT_S)


@pytest.mark.parametrize("how", ["wrong secret", "no secret", "classic report"])
def test_a_stranger_to_a_secret_master_gets_none_of_the_log_and_counts_for_nothing(
        master, secret_file, how):
    m = master(ha_secret_file=secret_file)
    with dial(m) as sock:
        if how == "classic report":
            sock.sendall(encode_report(1))
        else:
            result = handshake(sock, b"not the secret, not at all" if how == "wrong secret"
                               else None)
            assert result.status == hello.REFUSED
            assert "shared secret" in result.reason
            sock.sendall(encode_report(1))
        assert everything_until_closed(sock) == b""  # not a byte of the log
    assert acked(m) == [] and m.replication.status()["slaves"] == []
    assert testing.wait_for(lambda: m.replication.status()["refused"] == 1, timeout=WAIT_S)


def test_an_allowed_address_speaks_rocketmqs_protocol_and_others_are_closed_unread(master):
    """A RocketMQ 4.9.8 slave cannot change its protocol: its address admits it. A stranger
    from another address is closed at the accept, before anything is read."""
    m = master(ha_allow=["127.0.0.1/32"])
    end = m.max_phys_offset
    with dial(m, "127.0.0.2") as stranger:
        stranger.sendall(encode_report(1))
        assert everything_until_closed(stranger) == b""
    with dial(m) as sock:  # byte for byte as before: report 0, the last segment in frames
        sock.sendall(encode_report(0))
        offset, body = read_frame(sock)
        assert offset == end - end % SEG and body == log_bytes(m, offset, offset + len(body))
        (slave,) = m.replication.status()["slaves"]
        assert slave["admitted"] == "classic protocol, server.ha_allow"
    with dial(m) as sock:  # a handshake to a master with neither secret nor TLS
        result = handshake(sock, SECRET)
        assert result.status == hello.REFUSED and "takes no handshake" in result.reason
    assert testing.wait_for(lambda: m.replication.status()["refused"] == 2, timeout=WAIT_S)


def test_classic_slaves_by_address_and_mqstore_slaves_by_secret_together(master, secret_file):
    m = master(ha_allow=["127.0.0.2"], ha_secret_file=secret_file)
    end = m.max_phys_offset
    with dial(m, "127.0.0.2") as rocketmq, dial(m) as mqstore_slave, dial(m) as stranger:
        rocketmq.sendall(encode_report(end))
        assert read_frame(rocketmq) == (end, b"")
        assert handshake(mqstore_slave, SECRET).status == hello.ACCEPTED
        mqstore_slave.sendall(encode_report(end))
        assert read_frame(mqstore_slave) == (end, b"")
        stranger.sendall(encode_report(end))  # classic, but not from an allowed address
        assert everything_until_closed(stranger) == b""
        assert testing.wait_for(lambda: acked(m) == [end, end], timeout=WAIT_S)


def test_strangers_crowding_the_handshake_displace_each_other_not_a_slave(master, secret_file):
    m = master(ha_secret_file=secret_file)
    ha = m.replication.master
    end = m.max_phys_offset
    crowd = [dial(m, "127.0.0.2") for _ in range(MAX_PENDING - 1)]
    try:
        slave = dial(m)  # a slave's connection, its handshake not begun yet
        assert testing.wait_for(lambda: len(ha.pending()) == MAX_PENDING, timeout=WAIT_S)
        crowd += [dial(m, "127.0.0.2") for _ in range(MAX_PENDING)]  # each closes one of its own
        for sock in crowd[:MAX_PENDING]:
            assert everything_until_closed(sock) == b""
        with slave:
            assert handshake(slave, SECRET).status == hello.ACCEPTED
            slave.sendall(encode_report(end))
            assert read_frame(slave) == (end, b"")
            assert len(ha.pending()) == MAX_PENDING - 1 and len(ha.connections()) == 1
    finally:
        for sock in crowd:
            sock.close()


# -- TLS ---------------------------------------------------------------------------------------
def tls_dial(store, certs: dict | None, ca: str) -> ssl.SSLSocket:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca)
    if certs is not None:
        context.load_cert_chain(certs["ha_tls_cert_file"], certs["ha_tls_key_file"])
    return context.wrap_socket(dial(store), server_hostname="127.0.0.1")


def test_over_tls_a_slave_shows_a_certificate_of_the_ca(master, ha_certs):
    m = master(**ha_certs["master"])
    end = m.max_phys_offset
    ca = ha_certs["master"]["ha_tls_ca_file"]
    with tls_dial(m, ha_certs["slave"], ca) as sock:
        assert handshake(sock, None).status == hello.ACCEPTED
        sock.sendall(encode_report(end))
        assert read_frame(sock) == (end, b"")
        (slave,) = m.replication.status()["slaves"]
        assert slave["admitted"] == "handshake, TLS client certificate (commonName=slave)"
    for certs, alert in ((ha_certs["rogue"], "UNKNOWN_CA"), (None, "CERTIFICATE_REQUIRED")):
        with pytest.raises(ssl.SSLError, match=f"ALERT_{alert}"):
            with tls_dial(m, certs, ca) as sock:  # TLS 1.3: refused after the client's part
                sock.sendall(hello.encode_open())
                sock.recv(100)
    with dial(m) as plain:  # RocketMQ's classic protocol, in the clear
        plain.sendall(encode_report(1))
        assert b"\x00\x00\x00\x01" not in everything_until_closed(plain)
    assert acked(m) == []


def test_an_open_arriving_with_the_last_tls_handshake_message_is_answered(master, ha_certs):
    """The slave's first record can reach the master in one read with its last handshake
    message: it is answered at once, not after the housekeeping interval."""
    m = master(**ha_certs["master"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ha_certs["slave"]["ha_tls_ca_file"])
    context.load_cert_chain(ha_certs["slave"]["ha_tls_cert_file"],
                            ha_certs["slave"]["ha_tls_key_file"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with dial(m) as sock:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        tls.write(hello.encode_open())
        sock.sendall(outgoing.read())  # the client's Finished and the open, in one write
        sock.settimeout(FAST["ha_housekeeping_interval_ms"] / 1000 / 2)
        plain = b""
        while len(plain) < hello.HEADER_BYTES:
            try:
                plain += tls.read(65536)
            except ssl.SSLWantReadError:
                incoming.write(sock.recv(65536))
        assert hello.parse_header(plain[:hello.HEADER_BYTES]).kind == hello.CHALLENGE


# -- a slave facing a master -------------------------------------------------------------------
class FakeMaster:
    """Accepts one connection, keeps what the slave sends, and answers with ``script`` until
    the script ends or the slave closes (``slave_closed``)."""

    def __init__(self, script) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.received = b""
        self.slave_closed = False
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(script,), daemon=True).start()

    def _run(self, script) -> None:
        with self.server, self.server.accept()[0] as sock:
            sock.settimeout(WAIT_S)
            try:
                script(self, sock)
            except (AssertionError, OSError):
                self.slave_closed = True
            finally:
                self.done.set()

    def take(self, sock, n: int) -> bytes:
        data = read_exact(sock, n)
        self.received += data
        return data


@pytest.fixture
def slave(make_store, tmp_path):
    def make(master_address: str, **server):
        s = make_store({"commit_log": {"segment_bytes": SEG}, "store": {**FAST, "role": "slave"},
                        "server": {"ha_master": master_address, **server}},
                       root=tmp_path / "slave")
        s.replication.start()
        return s
    return make


def last_error(store) -> str:
    return store.replication.status().get("last_error") or ""


def test_a_slave_told_of_no_secret_speaks_rocketmqs_protocol(slave):
    def script(fake, sock):
        fake.take(sock, 8)
    fake = FakeMaster(script)
    slave(fake.address)
    assert fake.done.wait(WAIT_S)
    assert fake.received == encode_report(0)  # no handshake: a RocketMQ master is followed


def test_a_slave_with_a_secret_sends_a_rocketmq_master_one_negative_long(slave, secret_file):
    def script(fake, sock):  # what a RocketMQ master does: reads reports, sends heartbeats
        fake.take(sock, 8)
        sock.sendall(encode_header(0, 0))
        fake.take(sock, 1)
    fake = FakeMaster(script)
    s = slave(fake.address, ha_secret_file=secret_file)
    assert fake.done.wait(WAIT_S)
    assert fake.received == hello.encode_open() and fake.slave_closed  # one negative long
    assert testing.wait_for(lambda: "did not answer mqstore's handshake" in last_error(s),
                            timeout=WAIT_S)
    assert s.max_phys_offset == 0


@pytest.mark.parametrize("auth", [hello.AUTH_HMAC, hello.AUTH_NONE])
def test_a_slave_follows_no_master_that_cannot_prove_the_secret(slave, secret_file, auth):
    """A master that does not know the secret, whether it asks for it or not, is refused
    before a byte of its log is taken."""
    def script(fake, sock):
        opened = fake.take(sock, 8)
        challenge = hello.encode_challenge(1, auth, NONCE_M)
        sock.sendall(challenge)
        if auth == hello.AUTH_NONE:
            fake.take(sock, 1)  # nothing: the slave closes
            return
        head = fake.take(sock, 8)
        proof = head + fake.take(sock, hello.parse_header(head).length)
        wrong = b"a guess at the secret, wrong"
        sock.sendall(hello.encode_result(1, hello.ACCEPTED, "", wrong, opened + challenge + proof))
        sock.sendall(encode_header(0, 4) + b"junk")
        fake.take(sock, 1)
    fake = FakeMaster(script)
    s = slave(fake.address, ha_secret_file=secret_file)
    expected = ("master's proof does not match" if auth == hello.AUTH_HMAC
                else "asks for no shared secret")
    assert testing.wait_for(lambda: expected in last_error(s), timeout=WAIT_S)
    assert fake.done.wait(WAIT_S) and fake.slave_closed
    assert s.max_phys_offset == 0 and not s.replication.status()["connected"]


# -- configuration -----------------------------------------------------------------------------
def test_ha_access_settings_are_checked(tmp_path, ha_certs):
    with pytest.raises(ConfigError, match="server.ha_allow entry 'slave-1'"):
        load_config(overrides={"server": {"ha_allow": ["slave-1"]}})
    half = {k: v for k, v in ha_certs["master"].items() if k != "ha_tls_ca_file"}
    with pytest.raises(ConfigError, match="go together"):
        load_config(overrides={"server": half})
    with pytest.raises(ConfigError, match="speak no TLS"):
        load_config(overrides={"server": {**ha_certs["master"], "ha_allow": ["10.0.0.2"]}})
    assert load_config(overrides={"server": {"ha_allow": ["10.0.0.0/24", "fd00::1"]}}) \
        .server.ha_allow == ("10.0.0.0/24", "fd00::1")


@pytest.mark.parametrize("role", ["async_master", "sync_master"])
def test_a_master_beyond_loopback_told_of_no_slave_is_refused(role):
    for listen in ("0.0.0.0:10912", "[::]:10912", "10.0.0.1:10912", "broker-a:10912"):
        with pytest.raises(ConfigError, match="nothing says which peers are slaves"):
            load_config(overrides={"store": {"role": role}, "server": {"ha_listen": listen}})
    for listen in ("127.0.0.1:10912", "[::1]:0", "localhost:10912"):
        load_config(overrides={"store": {"role": role}, "server": {"ha_listen": listen}})
    for told in ({"ha_allow": ["10.0.0.2"]}, {"ha_secret_file": "ha.secret"},
                 {"ha_allow": ["0.0.0.0/0", "::/0"]}):
        load_config(overrides={"store": {"role": role},
                               "server": {"ha_listen": "0.0.0.0:10912", **told}})
    load_config(overrides={"store": {"role": "slave"},  # a slave does not listen
                           "server": {"ha_listen": "0.0.0.0:10912", "ha_master": "m:10912"}})


def test_a_missing_or_short_secret_is_refused_at_start(make_store, tmp_path):
    short = tmp_path / "short.secret"
    short.write_text("hunter2\n")
    for path, says in ((tmp_path / "none.secret", "cannot be read"),
                       (short, "holds 7 bytes")):
        s = make_store({"server": {"ha_listen": "127.0.0.1:0", "ha_secret_file": str(path)}},
                       root=tmp_path / path.stem)
        with pytest.raises(ConfigError, match=f"server.ha_secret_file .*{says}") as err:
            s.replication.start()
        assert "hunter2" not in str(err.value)
        assert s.replication.address is None
