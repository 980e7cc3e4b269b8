"""RocketMQ's HA wire format, byte for byte (``format.ha_frame``), and a master speaking it to
a bare socket: where frames start, how big they get, heartbeats, and what drops a connection.
The rules are the research note's (shared/research/rocketmq-ha.md), i.e. RocketMQ 4.9.8's."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from mqstore import MessageBatch, testing
from mqstore.format.ha_frame import (
    FRAME_MAX_BYTES, Frame, FrameDecoder, FrameError, ReportDecoder, encode_header,
    encode_report, first_transfer_offset,
)
from mqstore.replication.master import MAX_PENDING, MAX_SLAVES

from replication_support import log_bytes

SEG = 65536
WAIT_S = 10.0


# -- the layouts -------------------------------------------------------------------------------
def test_frame_header_is_a_long_offset_then_an_int_size_big_endian():
    assert encode_header(0x0102030405060708, 32768) == bytes.fromhex("0102030405060708" "00008000")
    assert encode_header(3 * SEG, 0) == struct.pack(">qi", 3 * SEG, 0)  # a heartbeat
    assert len(encode_header(0, 1)) == 12
    for offset, size in ((-1, 0), (0, -1), (0, FRAME_MAX_BYTES + 1)):
        with pytest.raises(ValueError):
            encode_header(offset, size)


def test_offset_report_is_one_big_endian_long():
    assert encode_report(0x1122334455667788) == bytes.fromhex("1122334455667788")
    assert encode_report(0) == b"\0" * 8
    with pytest.raises(ValueError):
        encode_report(-1)


def test_frames_come_out_whole_whatever_the_chunks():
    stream = (encode_header(100, 3) + b"abc" + encode_header(103, 0)
              + encode_header(103, 2) + b"de")
    decoder = FrameDecoder()
    frames = []
    for i in range(len(stream)):  # one byte at a time: every cut point
        frames += decoder.feed(stream[i:i + 1])
        assert decoder.buffered <= 12 + 3
    assert frames == [Frame(100, b"abc"), Frame(103, b""), Frame(103, b"de")]
    assert decoder.buffered == 0
    assert FrameDecoder().feed(stream) == frames  # and all at once


@pytest.mark.parametrize("offset, size", [(-5, 0), (0, -1), (0, FRAME_MAX_BYTES + 1),
                                          (0, 0x7FFFFFFF)])
def test_a_header_outside_the_rules_is_refused_before_its_body_is_held(offset, size):
    with pytest.raises(FrameError) as err:
        FrameDecoder().feed(struct.pack(">qi", offset, size))
    assert f"offset {offset}, size {size}" in str(err.value)


def test_a_frame_decoder_takes_no_more_than_its_bound():
    decoder = FrameDecoder(max_body_bytes=1024)
    assert decoder.feed(encode_header(0, 1024) + b"x" * 1024) == [Frame(0, b"x" * 1024)]
    with pytest.raises(FrameError):
        decoder.feed(encode_header(1024, 1025))


def test_reports_are_read_in_whole_longs_and_the_last_one_wins():
    decoder = ReportDecoder()
    assert decoder.feed(encode_report(5)[:3]) is None
    assert decoder.feed(encode_report(5)[3:] + encode_report(9)[:4]) == 5  # 9 is not whole
    assert decoder.feed(encode_report(9)[4:]) == 9
    assert decoder.feed(encode_report(1) + encode_report(2) + encode_report(70000)) == 70000
    with pytest.raises(FrameError, match="offset report -1"):
        decoder.feed(struct.pack(">q", -1))


def test_where_a_master_starts_a_slave():
    end = 3 * SEG + 1234
    assert first_transfer_offset(0, end, 0, SEG) == 3 * SEG  # an empty slave: the last segment
    assert first_transfer_offset(0, 2 * SEG, 0, SEG) == 2 * SEG
    assert first_transfer_offset(0, 0, -1, SEG) == 0  # an empty master
    assert first_transfer_offset(SEG + 77, end, 0, SEG) == SEG + 77  # where the slave ends
    assert first_transfer_offset(0, end, SEG, SEG, from_first_segment=True) == SEG
    assert first_transfer_offset(0, 0, -1, SEG, from_first_segment=True) == 0


# -- a master on the wire ----------------------------------------------------------------------
@pytest.fixture
def master(make_store):
    """A master with about 4.5 segments of records of mixed sizes, listening on a free port."""
    def make(**store):
        s = make_store({"commit_log": {"segment_bytes": SEG},
                        "store": {"ha_heartbeat_interval_ms": 200,
                                  "ha_housekeeping_interval_ms": 3000, **store},
                        "server": {"ha_listen": "127.0.0.1:0"}})
        bodies = [b"%d" % i * (1 + i % 97) for i in range(1500)]
        s.put_batch(MessageBatch(topic="ha", bodies=bodies, queue_ids=[i % 3 for i in range(1500)]))
        s.replication.start()
        return s
    return make


def dial(store) -> socket.socket:
    host, port = store.replication.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return sock


def read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    offset, size = struct.unpack(">qi", read_exact(sock, 12))
    return offset, read_exact(sock, size)


def frames_within(sock: socket.socket, seconds: float, gap: bool = False) -> list:
    """The frames that come in ``seconds`` (``gap``: until none comes for that long, within
    5 s)."""
    frames, until = [], time.monotonic() + (5.0 if gap else seconds)
    timeout = sock.gettimeout()
    try:
        while (left := min(until - time.monotonic(), seconds if gap else 5.0)) > 0:
            sock.settimeout(left)
            try:
                frames.append(read_frame(sock))
            except TimeoutError:
                break
    finally:
        sock.settimeout(timeout)
    return frames


def closed_by_peer(sock: socket.socket, timeout: float = WAIT_S) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.loops("thread")
def test_an_empty_slave_gets_the_last_segment_in_frames_of_32k_that_never_cross_a_segment(master):
    m = master()
    end = m.max_phys_offset
    assert end > 4 * SEG
    with dial(m) as sock:
        sock.sendall(encode_report(0)[:5])  # a report may arrive in pieces
        time.sleep(0.05)
        sock.sendall(encode_report(0)[5:])
        offset, body = read_frame(sock)
        assert offset == end - end % SEG
        got, pos = body, offset + len(body)
        while pos < end:
            offset, body = read_frame(sock)
            assert offset == pos and 0 < len(body) <= 32768
            assert offset // SEG == (offset + len(body) - 1) // SEG  # within one segment
            got += body
            pos += len(body)
        assert got == log_bytes(m, end - end % SEG, end)
        # Idle: heartbeats (size 0) naming the next offset, one an interval (200 ms). A
        # reader late on a loaded machine finds some waiting: those are taken first, then
        # those that come in 0.6 s are counted (a slow reader can only see fewer).
        assert read_frame(sock) == (end, b"")
        assert set(frames_within(sock, 0.05, gap=True)) <= {(end, b"")}
        came = frames_within(sock, 0.6)
        assert set(came) <= {(end, b"")} and len(came) <= 0.6 / 0.2 + 1


@pytest.mark.loops("thread")
def test_a_slave_is_sent_the_log_from_the_offset_it_reports(master):
    m = master()
    start = SEG + 1000  # not a record boundary: a master sends what is there, as RocketMQ's
    with dial(m) as sock:
        sock.sendall(encode_report(start))
        offset, body = read_frame(sock)
        assert offset == start and len(body) == 32768
        offset2, body2 = read_frame(sock)
        assert offset2 == start + 32768 and len(body2) == 2 * SEG - offset2  # to the segment end
        assert body + body2 == log_bytes(m, start, 2 * SEG)
        offset3, _body3 = read_frame(sock)
        assert offset3 == 2 * SEG


@pytest.mark.loops("thread")
def test_first_segment_option_starts_an_empty_slave_at_the_first_byte_stored(master):
    m = master(ha_new_slave_from="first_segment", ha_transfer_batch_bytes=4096)
    with dial(m) as sock:
        sock.sendall(encode_report(0))
        assert read_frame(sock) == (0, log_bytes(m, 0, 4096))


@pytest.mark.loops("thread")
def test_a_report_beyond_the_masters_end_drops_the_connection(master):
    m = master()
    end = m.max_phys_offset
    with dial(m) as sock:
        sock.sendall(encode_report(end))  # caught up
        assert read_frame(sock) == (end, b"")  # the heartbeat
        sock.sendall(encode_report(end + 1))
        assert closed_by_peer(sock)
    with dial(m) as sock:
        sock.sendall(encode_report(end + 100))  # a first report past the end, too
        assert closed_by_peer(sock)
    assert _wait(lambda: not m.replication.status()["slaves"])


@pytest.mark.loops("thread")
def test_garbage_scanners_and_crowds_do_not_stop_a_master(master):
    m = master()
    ha = m.replication.master
    end = m.max_phys_offset
    for _ in range(20):  # a port scanner: connect, go
        dial(m).close()
    with dial(m) as sock:
        sock.sendall(b"\xff" * 8)  # a negative offset
        assert closed_by_peer(sock)
    with dial(m) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # text: an offset far past the end
        assert closed_by_peer(sock)
    # Slaves hold at most MAX_SLAVES slots: one more is closed once it reported.
    slaves = [dial(m) for _ in range(MAX_SLAVES)]
    try:
        for sock in slaves:
            sock.sendall(encode_report(end))
        assert _wait(lambda: len(ha.connections()) == MAX_SLAVES)
        with dial(m) as extra:
            extra.sendall(encode_report(end))
            assert closed_by_peer(extra)
    finally:
        for sock in slaves:
            sock.close()
    assert _wait(lambda: not ha.connections() and not ha.pending())
    # Connections that say nothing wait unadmitted, MAX_PENDING at most, and hold no slave
    # slot: one more closes the oldest.
    silent = [dial(m) for _ in range(MAX_PENDING + 3)]
    try:
        assert _wait(lambda: len(ha.pending()) == MAX_PENDING)
        for sock in silent[:3]:
            assert closed_by_peer(sock)
        assert not ha.connections()
        with dial(m) as sock:  # and a real slave is still served
            sock.sendall(encode_report(end))
            assert read_frame(sock) == (end, b"")
            assert len(ha.connections()) == 1
    finally:
        for sock in silent:
            sock.close()
    assert m.put_batch(MessageBatch(topic="ha", bodies=[b"after"])).status.stored


@pytest.mark.loops("thread")
def test_a_silent_connection_is_closed_after_the_housekeeping_interval(master):
    m = master(ha_housekeeping_interval_ms=1000)
    began = time.monotonic()  # the master's clock for it runs from its accept
    with dial(m) as sock:
        assert closed_by_peer(sock, 10.0)  # no report at all: 1 s, with margin
        assert time.monotonic() - began >= 0.9


def _wait(condition):
    return testing.wait_for(condition, timeout=WAIT_S)


@pytest.mark.loops("thread")
def test_a_slave_needing_bytes_the_master_deleted_is_dropped_with_the_reason(master, caplog):
    m = master()
    assert len(m.delete_expired_segments(force=True, max_segments=2)) == 2
    with dial(m) as sock:
        sock.sendall(encode_report(100))  # inside the first segment, gone now
        assert closed_by_peer(sock)
    assert _wait(lambda: "no longer stores (its log starts at 131072)" in caplog.text)
    assert "must be rebuilt from the master" in caplog.text
