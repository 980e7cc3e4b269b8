"""The gRPC endpoint (issue 26): ``mqstore serve`` in a subprocess, driven by the official
RocketMQ 5 Python client, unchanged, and by the raw protocol where the client would refuse a
bad request before sending it. One server for the module; each test its own topic and group."""

from __future__ import annotations

import statistics
import threading
import time

import grpc
import pytest

from mqstore import MessageStore, load_config
from mqstore.testing import patience, wait_for
from endpoint_support import serving

pytestmark = pytest.mark.usefixtures("no_plugin_env")
MAX_BODY = 65536  # commit_log.max_message_bytes of the served store
LONG_POLL_S = 10


@pytest.fixture(scope="module")
def served(tmp_path_factory, home):
    with serving(tmp_path_factory.mktemp("served"), home,
                 extra=f"commit_log: {{segment_bytes: 1048576, max_message_bytes: {MAX_BODY}}}\n"
                       "index: {max_hash_slots: 1024, max_index_entries: 8192}\n") as server:
        yield server


@pytest.fixture
def stub(served):
    from mqstore.endpoint.protocol import service_pb2_grpc
    channel = grpc.insecure_channel(served.endpoint)
    yield service_pb2_grpc.MessagingServiceStub(channel)
    channel.close()


def stored(served, topic: str, count: int, timeout_s: float = 10.0) -> dict:
    """``{UNIQ_KEY: record}`` of the first ``count`` messages of ``topic``, read from the store
    directory beside the running server (waiting for dispatch to show them)."""
    root = served.root
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    deadline = time.monotonic() + patience(timeout_s)
    while True:
        with MessageStore.open(root, config=config, read_only=True) as store:
            found = {m.uniq_key: m for q in store.queue_ids(topic)
                     for m in store.get("reader", topic, q, 0, 1000).messages}
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_delay_message_is_received_at_its_time_not_before(clients, served):
    producer = clients.producer("Delayed")
    consumer = clients.consumer("delayed-g", {"Delayed": clients.mq.FilterExpression()})
    due_s = int(time.time()) + 3
    msg = clients.message("Delayed", b"later", keys="dk")
    msg.delivery_timestamp = due_s  # this client sends the value as the Timestamp's seconds
    producer.send(msg)
    got = clients.receive_all(consumer, 1, timeout_s=patience(60))
    received_at = time.time()
    assert [m.body for m in got] == [b"later"] and received_at >= due_s
    assert got[0].delivery_timestamp == due_s * 1000
    (copy,) = stored(served, "Delayed", 1).values()
    assert copy.store_timestamp >= due_s * 1000
    assert (copy.properties["TIMER_DELIVER_MS"], copy.properties["REAL_TOPIC"]) == (
        str(due_s * 1000), "Delayed")
    assert clients.receive_all(consumer, 1, timeout_s=3) == []  # once


def test_a_delay_past_the_timers_reach_is_refused(clients, stub):
    from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2
    msg = definition_pb2.Message(topic=definition_pb2.Resource(name="Delayed"), body=b"x")
    msg.system_properties.message_id = "01DELAY"
    msg.system_properties.message_type = definition_pb2.DELAY
    msg.system_properties.delivery_timestamp.FromMilliseconds(
        int(time.time() * 1000) + 4 * 24 * 3600 * 1000)
    reply = stub.SendMessage(service_pb2.SendMessageRequest(messages=[msg]), timeout=10)
    assert Code.Name(reply.status.code) == "ILLEGAL_DELIVERY_TIME"
    assert "store.timer_max_delay_sec" in reply.status.message


def test_sent_messages_arrive_with_every_field(clients, served):
    producer = clients.producer("Fields")
    sent = {}
    for i in range(6):
        msg = clients.message("Fields", b"body %d \x00\xff" % i, tag=f"t{i % 2}",
                              keys=[f"order-{i}", f"user-{i % 3}"],
                              properties={"region": "eu", "温度": f"{i}℃"})
        before_s = int(time.time())
        receipt = producer.send(msg)
        sent[receipt.message_id] = (i, receipt.offset, before_s)
    consumer = clients.consumer("fields-group", {"Fields": clients.mq.FilterExpression()})
    got = clients.receive_all(consumer, 6)
    assert sorted(m.message_id for m in got) == sorted(sent)
    records = stored(served, "Fields", 6)
    for m in got:
        i, offset, before_s = sent[m.message_id]
        assert m.topic == "Fields"
        assert m.body == b"body %d \x00\xff" % i
        assert m.tag == f"t{i % 2}"
        assert m.keys == {f"order-{i}", f"user-{i % 3}"}
        assert m.properties == {"region": "eu", "温度": f"{i}℃"}
        assert m.delivery_attempt == 1 and not m.corrupted
        assert m.receipt_handle
        record = records[m.message_id]
        assert record.queue_offset == offset
        assert record.tags == f"t{i % 2}"
        assert sorted(record.keys) == [f"order-{i}", f"user-{i % 3}"]
        assert record.properties["region"] == "eu" and record.uniq_key == m.message_id
        # The Python client sends whole seconds; the store keeps what it was given.
        assert m.born_timestamp == record.born_timestamp
        assert before_s * 1000 <= record.born_timestamp <= (before_s + 2) * 1000
        assert m._Message__store_timestamp == record.store_timestamp  # no public getter
        assert record.born_host.startswith("127.0.0.1:")


def test_tag_and_sql92_filters(clients):
    producer = clients.producer("Filtered")
    for i in range(12):
        producer.send(clients.message("Filtered", b"m%d" % i, tag="abc"[i % 3],
                                      properties={"n": str(i), "region": "eu" if i % 2 else "us"}))
    from rocketmq.grpc_protocol import FilterType
    FilterExpression = clients.mq.FilterExpression
    by_tag = clients.consumer("tag-group", {"Filtered": FilterExpression("a || c")})
    by_sql = clients.consumer("sql-group", {"Filtered": FilterExpression(
        "region = 'eu' AND n > 4", FilterType.SQL)})
    tagged = clients.receive_all(by_tag, 8)
    assert sorted(m.body for m in tagged) == sorted(b"m%d" % i for i in range(12) if i % 3 != 1)
    selected = clients.receive_all(by_sql, 4)
    assert sorted(m.body for m in selected) == [b"m11", b"m5", b"m7", b"m9"]
    rest = [by_tag.receive_async(32, 30), by_sql.receive_async(32, 30)]
    assert [f.result(30) for f in rest] == [[], []]  # nothing else matches


def test_a_long_poll_returns_as_soon_as_a_send_is_dispatched(clients, served, capsys):
    producer = clients.producer("Polled")
    consumer = clients.consumer("poll-group", {"Polled": clients.mq.FilterExpression()},
                                await_s=LONG_POLL_S)
    producer.send(clients.message("Polled", b"prime"))  # the topic exists once sent to
    (prime,) = clients.receive_all(consumer, 1)
    assert prime.body == b"prime"
    latencies = []
    for i in range(5):
        box = {}

        def receive():
            box["got"] = consumer.receive(32, 30)
            box["at"] = time.monotonic()
        t = threading.Thread(target=receive)
        t.start()
        wait_for(lambda: served.long_polls() >= 1, 30, interval=0.05,
                 what="the receive waiting on the server")
        producer.send(clients.message("Polled", b"wake %d" % i))
        sent_at = time.monotonic()
        t.join(LONG_POLL_S + 10)
        assert [m.body for m in box["got"]] == [b"wake %d" % i]
        for m in box["got"]:
            consumer.ack(m)
        latencies.append(box["at"] - sent_at)
    with capsys.disabled():
        print(f"\nlong-poll delivery after a send returned: "
              f"{', '.join(f'{s * 1000:.1f}' for s in latencies)} ms")
    # Woken by dispatch, not by the 1 s redelivery look nor the 10 s poll timeout.
    assert statistics.median(latencies) < 0.5, latencies
    assert max(latencies) < LONG_POLL_S / 2, latencies


@pytest.mark.slow
def test_an_unacknowledged_message_comes_back_with_the_next_attempt(clients):
    producer = clients.producer("Redelivered")
    receipt = producer.send(clients.message("Redelivered", b"again"))
    consumer = clients.consumer("redeliver-group",
                                {"Redelivered": clients.mq.FilterExpression()}, await_s=2)
    started = time.monotonic()  # its invisible second runs from the server's answer
    (first,) = consumer.receive(32, 1)
    assert (first.message_id, first.delivery_attempt) == (receipt.message_id, 1)
    (second,) = clients.receive_all(consumer, 1, ack=False)  # back once its second is up
    assert 0.9 < time.monotonic() - started < patience(10)
    assert (second.message_id, second.body, second.delivery_attempt) == (
        receipt.message_id, b"again", 2)
    assert second.receipt_handle != first.receipt_handle
    from rocketmq.v5.exception import BadRequestException
    with pytest.raises(BadRequestException) as stale:
        consumer.ack(first)
    assert stale.value.code == 40013 and "delivered again" in str(stale.value)
    consumer.ack(second)
    assert consumer.receive(32, 1) == []


def test_changing_the_invisible_duration_hands_out_a_new_handle(clients):
    producer = clients.producer("Extended")
    producer.send(clients.message("Extended", b"slow work"))
    consumer = clients.consumer("extend-group", {"Extended": clients.mq.FilterExpression()},
                                await_s=2)
    (msg,) = consumer.receive(32, 1)
    old = msg.receipt_handle
    consumer.change_invisible_duration(msg, 60)
    assert msg.receipt_handle != old
    assert consumer.receive(32, 30) == []  # not back after its first second: 60 s now
    stale = clients.message("Extended", b"x")
    stale.topic, stale.message_id, stale.receipt_handle = "Extended", msg.message_id, old
    stale.endpoints = msg.endpoints
    from rocketmq.v5.exception import BadRequestException
    with pytest.raises(BadRequestException) as err:
        consumer.ack(stale)
    assert err.value.code == 40013 and "new invisible time" in str(err.value)
    consumer.ack(msg)


def stored_messages(served, topic: str) -> int:
    """Messages of ``topic`` in the store, read beside the running server."""
    with MessageStore.open(served.log_path.parent / "store", config=load_config(overrides={
            "plugins": {"load_entry_points": False}}), read_only=True) as store:
        return sum(store.max_offset(topic, q) for q in store.queue_ids(topic))


def test_requests_refused_with_rocketmqs_codes(clients, stub, served):
    from rocketmq.grpc_protocol import FilterType
    from rocketmq.v5 import exception as exc
    from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2
    consumer = clients.consumer("bad-group", {"NoSuchTopic": clients.mq.FilterExpression()})
    with pytest.raises(exc.NotFoundException) as err:
        consumer.receive(32, 30)
    assert err.value.code == Code.TOPIC_NOT_FOUND
    assert "'NoSuchTopic' does not exist" in str(err.value)
    producer = clients.producer("Refused")
    producer.send(clients.message("Refused", b"exists"))
    bad_sql = clients.consumer("sql-bad", {"Refused": clients.mq.FilterExpression(
        "a = = 1", FilterType.SQL)})
    with pytest.raises(exc.BadRequestException) as err:
        bad_sql.receive(32, 30)
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION and "'a = = 1'" in str(err.value)
    with pytest.raises(exc.BadRequestException) as err:
        clients.consumer("short", {"Refused": clients.mq.FilterExpression()}).receive(32, 0)
    assert err.value.code == Code.ILLEGAL_INVISIBLE_TIME
    # The producer took the store's limit from the Settings reply: it refuses locally.
    with pytest.raises(exc.IllegalArgumentException, match=f"max size={MAX_BODY} bytes"):
        producer.send(clients.message("Refused", b"x" * (MAX_BODY + 1)))

    def send(topic="Refused", body=b"b", properties=None, kind=definition_pb2.NORMAL):
        msg = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=body,
                                     user_properties=properties or {})
        msg.system_properties.message_id = "01ABC"
        msg.system_properties.message_type = kind
        return stub.SendMessage(service_pb2.SendMessageRequest(messages=[msg]), timeout=10)
    deadline = time.monotonic() + patience(10)
    while stored_messages(served, "Refused") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stored_messages(served, "Refused") == 1
    for fields, code, needle in [
        ({"body": b"x" * (MAX_BODY + 1)}, Code.MESSAGE_BODY_TOO_LARGE, f"exceeds {MAX_BODY}"),
        ({"body": b""}, Code.MESSAGE_BODY_EMPTY, "cannot be empty"),
        ({"topic": "bad topic!"}, Code.ILLEGAL_TOPIC, "'bad topic!'"),
        ({"properties": {"UNIQ_KEY": "mine"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "UNIQ_KEY"),
        ({"kind": definition_pb2.DELAY}, Code.ILLEGAL_DELIVERY_TIME, "delivery_timestamp"),
        ({"kind": definition_pb2.LITE}, Code.UNSUPPORTED, "LITE"),
    ]:
        reply = send(**fields)
        assert (Code.Name(reply.status.code), len(reply.entries)) == (Code.Name(code), 0), fields
        assert needle in reply.status.message, reply.status.message
    # What the endpoint's checks pass and the store refuses: the put's own answer, per message.
    reply = send(properties={"__CRC32\"": "x"})  # a bit away from the record CRC's name
    assert (Code.Name(reply.status.code), len(reply.entries)) == ("BAD_REQUEST", 0)
    assert "within 2 bits of the store's __CRC32#" in reply.status.message
    reply = send(properties={"big": "x" * 40_000})
    assert Code.Name(reply.status.code) == "MESSAGE_PROPERTIES_TOO_LARGE"
    assert [(Code.Name(e.status.code), e.message_id, e.offset) for e in reply.entries] == [
        ("MESSAGE_PROPERTIES_TOO_LARGE", "01ABC", 0)]
    assert "PROPERTIES_SIZE_EXCEEDED: properties are" in reply.status.message
    time.sleep(0.2)
    assert stored_messages(served, "Refused") == 1  # refusals store nothing
    with pytest.raises(grpc.RpcError) as err:
        stub.RecallMessage(service_pb2.RecallMessageRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "does not implement RecallMessage" in err.value.details()


def test_sends_in_flight_together_are_each_answered_exactly(stub, served):
    """Many sends at once (NOTE [ Send groups ]: put together): each OK one is stored at its
    own queue offset, and the one the store refuses is refused alone, nothing of it stored."""
    from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2

    def request(i: int, big: bool = False):
        msg = definition_pb2.Message(topic=definition_pb2.Resource(name="Together"),
                                     body=b"together %d" % i,
                                     user_properties={"big": "x" * 40_000} if big else {})
        msg.system_properties.message_id = f"T{i:04d}"
        return service_pb2.SendMessageRequest(messages=[msg])
    answered = {}
    for _round in range(3):  # the first round starts the stream; the next ones are grouped
        calls = [stub.SendMessage.future(request(i, big=i == 17), timeout=30)
                 for i in range(_round * 40, _round * 40 + 40)]
        replies = [call.result() for call in calls]
        for i, reply in zip(range(_round * 40, _round * 40 + 40), replies):
            if i == 17:
                assert Code.Name(reply.status.code) == "MESSAGE_PROPERTIES_TOO_LARGE"
                assert [e.message_id for e in reply.entries] == ["T0017"]
            else:
                assert Code.Name(reply.status.code) == "OK", reply
                assert [e.message_id for e in reply.entries] == [f"T{i:04d}"]
                answered[f"T{i:04d}"] = reply.entries[0].offset
    found = stored(served, "Together", 119)
    assert len(found) == 119 and "T0017" not in found
    assert {key: m.queue_offset for key, m in found.items()} == answered
    per_queue: dict = {}
    for m in found.values():
        per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in per_queue.values())


def test_settings_are_answered_filled_in_as_the_proxy_does(stub):
    from mqstore.endpoint.protocol import definition_pb2, service_pb2
    producer = definition_pb2.Settings(client_type=definition_pb2.PRODUCER,
                                       publishing=definition_pb2.Publishing(max_body_size=1))
    consumer = definition_pb2.Settings(client_type=definition_pb2.SIMPLE_CONSUMER,
                                       subscription=definition_pb2.Subscription(
                                           group=definition_pb2.Resource(name="g")))
    call = stub.Telemetry(iter([service_pb2.TelemetryCommand(settings=producer),
                                service_pb2.TelemetryCommand(settings=consumer)]), timeout=10)
    first, second = list(call)
    assert first.status.code == second.status.code == 20000
    p = first.settings
    assert (p.publishing.max_body_size, p.publishing.validate_message_type) == (MAX_BODY, True)
    assert p.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert p.backoff_policy.max_attempts == 3 and not p.metric.on
    c = second.settings
    assert c.subscription.group.name == "g" and c.subscription.receive_batch_size == 32
    assert c.subscription.long_polling_timeout.seconds == 20
    assert c.backoff_policy.max_attempts == 17
    assert [d.seconds for d in c.backoff_policy.customized_backoff.next][:4] == [1, 5, 10, 30]


def test_route_names_one_broker_at_the_address_dialled(stub, served):
    from mqstore.endpoint.protocol import definition_pb2, service_pb2
    host, port = served.endpoint.split(":")
    dialled = definition_pb2.Endpoints(scheme=definition_pb2.IPv4, addresses=[
        definition_pb2.Address(host="10.1.2.3", port=9876)])
    reply = stub.QueryRoute(service_pb2.QueryRouteRequest(
        topic=definition_pb2.Resource(name="NotYetSent"), endpoints=dialled), timeout=10)
    assert reply.status.code == 20000
    assert [q.id for q in reply.message_queues] == [0, 1, 2, 3]  # auto-created on first send
    for q in reply.message_queues:
        assert q.permission == definition_pb2.READ_WRITE and q.broker.id == 0
        assert q.broker.endpoints == dialled
        assert list(q.accept_message_types) == [definition_pb2.NORMAL, definition_pb2.FIFO,
                                                definition_pb2.DELAY,
                                                definition_pb2.TRANSACTION]
    own = stub.QueryRoute(service_pb2.QueryRouteRequest(
        topic=definition_pb2.Resource(name="NotYetSent")), timeout=10)
    address = own.message_queues[0].broker.endpoints.addresses[0]
    assert (address.host, address.port) == (host, int(port))
