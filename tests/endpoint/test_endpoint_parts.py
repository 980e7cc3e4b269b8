"""The gRPC endpoint's parts on their own: the batched put's refusals, the wire conversion's
edge cases, the signature check, and the bounds on connections and clients."""

from __future__ import annotations

import asyncio
import errno
import gzip
import hashlib
import hmac
import threading

import numpy as np
import pytest

from mqstore import Message
from mqstore.config import ServerSection
from mqstore.endpoint.backlog import Backlog
from mqstore.endpoint.limits import check_exposure
from mqstore.endpoint.pops import Pops, filter_of
from mqstore.endpoint.service import _failure as service_failure
from mqstore.errors import ConfigError
from mqstore.endpoint.auth import AccessKeys, AdminAccess, sign, signed_at, signed_metadata
from mqstore.endpoint.limits import (
    Peers, connection_cap, other_listeners, reserved_descriptors,
)
from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2
from mqstore.endpoint.route import Topics
from mqstore.endpoint.creations import Creations
from mqstore.endpoint.send import QUIET_GROUPS, PutBatcher, Sender, put_all
from mqstore.endpoint.settings import Sessions
from mqstore.endpoint.status import EndpointError, put_status
from mqstore.endpoint.wire import java_host, md5_digest, to_store
from mqstore.message import BatchPutResult, PutResult, PutStatus


@pytest.mark.loops("thread")
def test_a_batch_refuses_only_the_request_the_store_refuses(make_store):
    store = make_store()
    good_a = [Message("T", b"a1", queue_id=0), Message("T", b"a2", queue_id=0)]
    too_big = [Message("T", b"b", queue_id=0, properties={"p": "x" * 40_000})]
    good_c = [Message("T", b"c", queue_id=0)]
    results = put_all(store, [good_a, too_big, good_c])
    assert [r[0] for r in results] == [PutStatus.PUT_OK, PutStatus.PROPERTIES_SIZE_EXCEEDED,
                                       PutStatus.PUT_OK]
    assert results[0][2] == [0, 1] and results[2][2] == [2] and results[1][2] == []
    assert "properties are" in results[1][1]
    store.wait_dispatched()
    got = store.get("g", "T", 0, 0, 10)
    assert [m.body for m in got.messages] == [b"a1", b"a2", b"c"]


@pytest.mark.loops("thread")
def test_a_store_wide_refusal_answers_every_request(make_store):
    store = make_store()
    store.running_flags |= 16  # DISK_FULL, as cleanup sets it past disk_warning_ratio
    results = put_all(store, [[Message("T", b"a")], [Message("T", b"b")]])
    assert [r[0] for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2
    assert all("disk full" in r[1] for r in results)


class Recorder:
    """A store that records each put: which messages went together."""

    def __init__(self) -> None:
        self.puts: list[list[str]] = []

    def put(self, message):
        self.puts.append([message])
        return PutResult(PutStatus.PUT_OK, 0, len(self.puts))

    def put_batch(self, messages):
        self.puts.append(list(messages))
        n = len(messages)
        offsets = np.arange(n, dtype=np.int64) + 100 * len(self.puts)
        return BatchPutResult(PutStatus.PUT_OK, np.zeros(n, dtype=np.int64), offsets, offsets,
                              np.ones(n, dtype=np.int64), 0, None)


def test_send_groups_lone_requests_at_once_and_a_stream_together():
    """NOTE [ Send groups ]: gaps and windows long enough that only the rules decide."""
    store = Recorder()
    batcher = PutBatcher(store, gap_s=60.0, window_s=60.0, most=3)

    async def scenario():
        for name in ("a", "b"):  # a client that waits for each answer: at the next turn
            assert await asyncio.wait_for(batcher.put([name]), 30) == (PutStatus.PUT_OK, None,
                                                                        [len(store.puts)])
        # two in one turn: one group, and from now on sends stream in
        assert await asyncio.gather(batcher.put(["c"]), batcher.put(["d", "e"])) == [
            (PutStatus.PUT_OK, None, [300]), (PutStatus.PUT_OK, None, [301, 302])]
        first = asyncio.ensure_future(batcher.put(["f"]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not first.done()  # waits for more, though later turns passed
        rest = [asyncio.ensure_future(batcher.put([name])) for name in ("g", "h")]
        assert await asyncio.wait_for(asyncio.gather(first, *rest), 30) == [
            (PutStatus.PUT_OK, None, [400]), (PutStatus.PUT_OK, None, [401]),
            (PutStatus.PUT_OK, None, [402])]  # the group held "most" requests: it went

    asyncio.run(scenario())
    assert store.puts == [["a"], ["b"], ["c", "d", "e"], ["f", "g", "h"]]


def test_a_stream_group_goes_after_its_window_and_lone_groups_end_the_stream():
    store = Recorder()
    batcher = PutBatcher(store, gap_s=60.0, window_s=0.05)

    async def scenario():
        await asyncio.gather(batcher.put(["a"]), batcher.put(["b"]))  # a stream
        for i in range(QUIET_GROUPS):  # each alone, each after the window
            await asyncio.wait_for(batcher.put([f"lone{i}"]), 30)
        last = asyncio.ensure_future(batcher.put(["after"]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert last.done()  # the stream is over: a lone request goes at the next turn

    asyncio.run(scenario())
    assert store.puts == [["a", "b"]] + [[f"lone{i}"] for i in range(QUIET_GROUPS)] + [["after"]]


def wire_message(**system) -> definition_pb2.Message:
    msg = definition_pb2.Message(topic=definition_pb2.Resource(name="T"),
                                 body=system.pop("body", b"body"))
    msg.system_properties.message_id = "01AB"
    for name, value in system.items():
        if name == "keys":
            msg.system_properties.keys.extend(value)
        else:
            setattr(msg.system_properties, name, value)
    return msg


def test_gzip_bodies_are_stored_inflated_and_bounded():
    m = to_store(wire_message(body=gzip.compress(b"z" * 1000),
                              body_encoding=definition_pb2.GZIP), "T", None, 4096)
    assert m.body == b"z" * 1000
    with pytest.raises(EndpointError) as err:
        to_store(wire_message(body=gzip.compress(b"z" * 5000),
                              body_encoding=definition_pb2.GZIP), "T", None, 4096)
    assert err.value.code == Code.MESSAGE_BODY_TOO_LARGE
    with pytest.raises(EndpointError) as err:
        to_store(wire_message(body=b"not gzip", body_encoding=definition_pb2.GZIP), "T", None,
                 4096)
    assert err.value.code == Code.MESSAGE_CORRUPTED


def test_keys_are_joined_and_split_as_rocketmq_does_and_bad_text_is_refused():
    m = to_store(wire_message(keys=["a b", "c"]), "T", "10.0.0.1:5", 4096)
    assert (m.keys, m.born_host, m.properties["UNIQ_KEY"]) == (["a", "b", "c"], "10.0.0.1:5",
                                                               "01AB")
    for fields, code in (({"tag": "a\x01b"}, Code.ILLEGAL_MESSAGE_TAG),
                         ({"keys": ["k\x02"]}, Code.ILLEGAL_MESSAGE_KEY),
                         ({"message_id": ""}, Code.ILLEGAL_MESSAGE_ID),
                         ({"message_type": definition_pb2.LITE}, Code.UNSUPPORTED)):
        with pytest.raises(EndpointError) as err:
            to_store(wire_message(**fields), "T", None, 4096)
        assert err.value.code == code, fields


def test_a_transactional_send_is_a_half_of_the_topics_group():
    """As the proxy: TRAN_MSG, the topic as producer group, the recovery duration's seconds."""
    m = to_store(wire_message(message_type=definition_pb2.TRANSACTION), "T", None, 4096)
    assert (m.properties["TRAN_MSG"], m.properties["PGROUP"]) == ("true", "T")
    assert "CHECK_IMMUNITY_TIME_IN_SECONDS" not in m.properties
    msg = wire_message(message_type=definition_pb2.TRANSACTION)
    msg.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    assert to_store(msg, "T", None, 4096).properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "30"


def test_born_timestamps_read_as_protobuf_reads_them():
    def born(**stamp):
        msg = wire_message()
        if stamp:
            msg.system_properties.born_timestamp.seconds = stamp.get("seconds", 0)
            msg.system_properties.born_timestamp.nanos = stamp.get("nanos", 0)
        return to_store(msg, "T", None, 4096).born_timestamp

    assert born(seconds=1_700_000_000, nanos=123_456_789) == 1_700_000_000_123
    assert born(seconds=253_402_300_799, nanos=999_999_999) == 253_402_300_799_999
    assert born() is None  # none sent: the store's time
    assert born(seconds=0, nanos=5_000_000) == 5
    assert born(seconds=-5) is None  # before 1970: the store's time
    for bad in ({"seconds": 253_402_300_800}, {"seconds": 1, "nanos": -1}):
        with pytest.raises(ValueError, match="Timestamp is not valid"):
            born(**bad)


def test_hosts_read_as_javas_getHostAddress_and_digests_as_the_proxys():
    assert java_host("[fd12:3456:789a::1]:10911") == ("fd12:3456:789a:0:0:0:0:1", "10911")
    assert java_host("[::]:0") == ("0:0:0:0:0:0:0:0", "0")
    assert java_host("10.1.2.3:80") == ("10.1.2.3", "80")
    assert md5_digest(b"") == "D41D8CD98F00B204E9800998ECF8427E"


def test_signatures_are_checked_against_the_access_keys_secret():
    stamp = "20260101T000000Z"
    keys = AccessKeys({"app": "s3cret"}, clock=lambda: signed_at(stamp) + 10)
    good = (f"MQv2-HMAC-SHA1 Credential=app, SignedHeaders=x-mq-date-time, "
            f"Signature={sign('s3cret', stamp)}")
    assert sign("s3cret", stamp) == hmac.new(b"s3cret", stamp.encode(), hashlib.sha1).hexdigest()
    assert keys.check({"authorization": good, "x-mq-date-time": stamp}) == "app"
    for metadata, needle in (
            ({}, "carries no authorization"),
            ({"authorization": good, "x-mq-date-time": "20260101T000001Z"}, "does not match"),
            ({"authorization": good.replace("app", "other"), "x-mq-date-time": stamp},
             "'other' is not one"),
            ({"authorization": "Basic abc", "x-mq-date-time": stamp}, "'Basic'")):
        with pytest.raises(EndpointError) as err:
            keys.check(metadata)
        assert err.value.code == Code.UNAUTHORIZED and needle in err.value.message
    assert AccessKeys({}).check({}) is None  # no keys: every call passes


@pytest.mark.parametrize("signed, now, ok", [
    ("20260101T000000Z", "20260101T001500Z", True),  # 15 minutes late: the window's edge
    ("20260101T000000Z", "20260101T001501Z", False),
    ("20260101T001500Z", "20260101T000000Z", True),  # 15 minutes ahead
    ("20260101T001501Z", "20260101T000000Z", False),
    ("20200101T000000Z", "20260101T000000Z", False),  # a signature seen years ago
    ("2026-01-01T00:00:00Z", "20260101T000000Z", False),  # not RocketMQ's format
])
def test_a_signature_is_good_only_near_the_servers_clock(signed, now, ok):
    keys = AccessKeys({"app": "s3cret"}, clock=lambda: signed_at(now))
    metadata = dict(signed_metadata("app", "s3cret", signed))
    if ok:
        assert keys.check(metadata) == "app"
        return
    with pytest.raises(EndpointError) as err:
        keys.check(metadata)
    assert err.value.code == Code.UNAUTHORIZED
    assert ("server.grpc_signature_skew_ms" in err.value.message
            or "is not yyyyMMddTHHmmssZ" in err.value.message)


def test_client_keys_never_open_the_admin_service():
    now = lambda: signed_at("20260101T000000Z")  # noqa: E731
    client = AccessKeys({"app": "s3cret"}, clock=now)
    admins = AccessKeys({"ops": "0ps"}, clock=now, setting="server.grpc_admin_keys")
    app = dict(signed_metadata("app", "s3cret", "20260101T000000Z"))
    ops = dict(signed_metadata("ops", "0ps", "20260101T000000Z"))
    AdminAccess(admins, client).check(ops)
    with pytest.raises(EndpointError) as err:
        AdminAccess(admins, client).check(app)
    assert err.value.message == "access key 'app' is not one of server.grpc_admin_keys"
    with pytest.raises(EndpointError) as err:  # client keys and no admin keys: nobody
        AdminAccess(AccessKeys({}), client).check(app)
    assert "set server.grpc_admin_keys" in err.value.message
    AdminAccess(AccessKeys({}), AccessKeys({})).check({})  # no keys at all: loopback only


def test_grpc_takes_no_more_connections_than_the_descriptor_limit_leaves(caplog):
    from mqstore.config import StoreConfig
    config = StoreConfig()  # 128 mapped files, 64 pop states, 64 HTTP connections, no remoting
    assert (reserved_descriptors(config), other_listeners(config)) == (2 * 128 + 2 * 64 + 64, 0)
    with_remoting = config.replace(server={"remoting_listen": "127.0.0.1:0"})
    assert other_listeners(with_remoting) == 1024
    assert connection_cap(1024, 448, limit=65536, open_now=110) == 1024
    assert connection_cap(1024, 448, 1024, limit=65536, open_now=110) == 1024
    assert caplog.records == []
    # 1024 - 64 headroom - 110 open - 448 reserved
    assert connection_cap(1024, 448, limit=1024, open_now=110) == 402
    [said] = caplog.records
    assert said.getMessage().startswith(
        "the gRPC endpoint accepts at most 402 connections, not server.grpc_max_connections "
        "(1024): the descriptor limit (RLIMIT_NOFILE 1024) leaves no more")
    assert connection_cap(1024, 448, 1024, limit=1024, open_now=110) == 201  # half, shared
    assert connection_cap(1024, 448, limit=256, open_now=110) == 1  # never none


def test_connections_and_clients_are_bounded_and_idle_ones_forgotten():
    now = [0.0]
    peers = Peers(2, idle_ms=1000, clock=lambda: now[0])
    peers.enter("ipv4:1.1.1.1:1")
    peers.enter("ipv4:1.1.1.1:2")
    with pytest.raises(EndpointError) as err:
        peers.enter("ipv4:1.1.1.1:3")
    assert err.value.code == Code.TOO_MANY_REQUESTS
    peers.leave("ipv4:1.1.1.1:1")
    now[0] = 2.0  # the first has had no RPC for longer than the idle time
    peers.enter("ipv4:1.1.1.1:3")
    assert len(peers) == 2
    with pytest.raises(EndpointError):
        peers.enter("ipv4:1.1.1.1:4")  # the second still has an RPC in flight
    sessions = Sessions(1, idle_ms=1000, clock=lambda: now[0])
    sessions.seen("client-a", definition_pb2.PRODUCER)
    with pytest.raises(EndpointError):
        sessions.seen("client-b", definition_pb2.PRODUCER)
    now[0] = 5.0
    sessions.seen("client-b", definition_pb2.PRODUCER)
    assert sessions.get("client-a") is None and sessions.get("client-b") is not None


@pytest.mark.loops("thread")
def test_topics_with_configs_are_routed_and_sent_to_their_write_queues(make_store):
    """QueryRoute and a FIFO send's queue follow the topic's config (docs/topics.md): a
    configured topic exists before its first message, and its route lists its write queues,
    the only ones its puts take."""
    store = make_store({"queue_select": {"queues_per_topic": 4}})
    topics = Topics(store, 4, auto_create=False)
    store.put(Message("Legacy", b"x", queue_id=6))
    store.wait_dispatched()
    assert topics.queues("Orders") is None  # neither a config nor a queue
    assert topics.queues("Legacy") == [0, 1, 2, 3, 6]  # a store without topics.json
    store.create_topic("Orders", read_queues=8, write_queues=2)
    store.create_topic("Archive", queues=3, perm=4)
    assert topics.queues("Orders") == [0, 1]
    assert topics.queues("Archive") == [0, 1, 2]
    assert topics.queues("Legacy") == [0, 1, 2, 3, 4, 5, 6]  # adopted with 7 queues
    topics.for_receive("Orders")  # exists: no TOPIC_NOT_FOUND before its first message
    assert topics.for_send("Orders")  # it exists: the send creates nothing
    sender = Sender(store, topics, store.config, Creations(0, 0, lambda t, g: False))
    try:
        request = service_pb2.SendMessageRequest(messages=[
            wire_message(message_group=f"group-{i}") for i in range(16)])
        for m in request.messages:
            m.topic.name = "Orders"
        assert {m.queue_id for m in sender.messages(request, "ipv4:127.0.0.1:5")} == {0, 1}
    finally:
        sender.close()


def test_the_brokers_topic_refusals_answer_the_proxys_codes():
    assert put_status(PutStatus.TOPIC_NOT_EXIST, "no config").code == Code.TOPIC_NOT_FOUND
    assert put_status(PutStatus.NO_PERMISSION, "perm 4").code == Code.FORBIDDEN
    assert put_status(PutStatus.NO_PERMISSION, "perm 4").message == \
        "send failed, NO_PERMISSION: perm 4"


def test_filters_compile_on_a_thread_of_their_own(make_store, monkeypatch):
    """A long SQL92 expression compiles off the event loop (which stays free for every other
    call); a bad one is refused with ILLEGAL_FILTER_EXPRESSION, its text cut short."""
    store = make_store({"plugins": {"modules": ["mqstore.plugins.filter_sql92"]}})
    pops = Pops(store)
    threads = []
    compile_filter = store.view.compile_filter

    def spy(expression, expression_type):
        threads.append(threading.current_thread().name)
        return compile_filter(expression, expression_type)

    monkeypatch.setattr(store.view, "compile_filter", spy)

    async def check(expression):
        loop_thread = threading.current_thread().name
        await pops.check_filter(expression, "SQL92")
        return loop_thread

    try:
        loop_thread = asyncio.run(check("a = 1 AND b = 'x'"))
        assert threads and threads[0].startswith("mqstore-grpc-filter")
        assert loop_thread not in threads
        with pytest.raises(EndpointError) as err:
            asyncio.run(check("a = " + "'x" * 5000))
        assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION
        assert len(err.value.message) < 600
    finally:
        pops.close()


def test_a_filter_longer_than_the_endpoint_compiles_is_refused_unread():
    text = "TagA || " * 3000
    with pytest.raises(EndpointError) as err:
        filter_of(definition_pb2.FilterExpression(type=definition_pb2.FilterType.TAG,
                                                  expression=text))
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert err.value.message == (f"TAG filter {text[:32]!r}... ({len(text)} characters) is "
                                 f"longer than 16384 characters, the longest this endpoint "
                                 f"compiles")


def test_the_backlog_admits_while_both_bounds_have_room():
    backlog = Backlog(per_connection=100, total=150)
    backlog.admit("a")
    assert backlog.room("a") == 100
    backlog.charge("a", 100)
    with pytest.raises(EndpointError) as err:
        backlog.admit("a")
    assert err.value.code == Code.TOO_MANY_REQUESTS
    assert "server.grpc_max_unwritten_bytes_per_connection (100)" in err.value.message
    assert backlog.room("b") == 50  # the endpoint's room is less than b's own
    backlog.charge("b", 60)
    with pytest.raises(EndpointError) as err:
        backlog.admit("c")
    assert "server.grpc_max_unwritten_bytes (150)" in err.value.message
    backlog.release("a", 100)
    backlog.admit("c")
    assert (backlog.held, backlog.of("a"), backlog.of("b")) == (60, 0, 60)


def test_running_out_of_descriptors_is_a_refusal_to_retry():
    code, message = service_failure("ReceiveMessage", OSError(errno.EMFILE,
                                                             "Too many open files"))
    assert code == Code.TOO_MANY_REQUESTS
    assert message == ("ReceiveMessage refused: the server is out of file descriptors for "
                       "now; try again later")


@pytest.mark.parametrize("listen, open_ok", [
    ("127.0.0.1:8081", True), ("127.8.9.10:0", True), ("localhost:8081", True),
    ("[::1]:8081", True), ("0.0.0.0:8081", False), ("[::]:8081", False),
    ("10.0.0.5:8081", False), ("mq.example.com:8081", False),
])
def test_an_open_admin_service_is_refused_beyond_loopback(listen, open_ok):
    server = ServerSection(grpc_listen=listen)
    if open_ok:
        check_exposure(server, admin_served=True)
    else:
        with pytest.raises(ConfigError, match="set server.grpc_admin_keys"):
            check_exposure(server, admin_served=True)
    # Admin keys, or no admin service, are fine anywhere.
    check_exposure(ServerSection(grpc_listen=listen, grpc_admin_keys=["ops:s"]), True)
    check_exposure(ServerSection(grpc_listen=listen, grpc_admin_enabled=False), True)
    check_exposure(server, admin_served=False)


def test_transaction_ids_name_the_half_and_others_are_refused():
    from mqstore.endpoint.transactions import half_offset, transaction_id
    from mqstore.format.hosts import parse_host

    text = transaction_id(parse_host("127.0.0.1:10911"), 30_061)
    assert text == "7F00000100002A9F000000000000756D"  # the fixture's half tx-0, as 4.9.8
    assert half_offset(text) == 30_061
    for bad in ("", "xyz", text[:-1], text + "0", "G" * 32):
        with pytest.raises(EndpointError) as err:
            half_offset(bad)
        assert err.value.code == Code.INVALID_TRANSACTION_ID and "32 hex digits" in err.value.message


def test_end_transaction_of_no_open_half_is_invalid(make_store):
    from mqstore.endpoint.transactions import Producers, Transactions, transaction_id

    store = make_store()
    plain = store.put(Message("T", b"plain", queue_id=0))
    half = store.put(Message("T", b"h", queue_id=0, properties={
        "TRAN_MSG": "true", "PGROUP": "T", "UNIQ_KEY": "M1"}))
    loop = asyncio.new_event_loop()
    try:
        tx = Transactions(store, Producers(), loop)

        def end(offset, message_id, resolution=definition_pb2.TransactionResolution.COMMIT):
            request = service_pb2.EndTransactionRequest(
                message_id=message_id, resolution=resolution,
                transaction_id=transaction_id(store.store_host, offset))
            return loop.run_until_complete(tx.end(request)).status

        assert end(plain.phys_offset, "M1").code == Code.INVALID_TRANSACTION_ID
        assert end(half.phys_offset, "other").code == Code.INVALID_TRANSACTION_ID
        unknown = definition_pb2.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        assert end(half.phys_offset, "M1", unknown).code == Code.OK  # still open
        store.wait_dispatched()
        assert [t.message_id for t in store.open_transactions()] == ["M1"]
        assert end(half.phys_offset, "M1").code == Code.OK
        again = end(half.phys_offset, "M1")
        assert again.code == Code.INVALID_TRANSACTION_ID and "not open" in again.message
    finally:
        loop.close()
