"""``mqstore topic|group ... --server``: the endpoint's admin service (``mqstore.admin.v1.Admin``)
on a running ``mqstore serve`` with client access keys and admin keys, the commands as
subprocesses, the official client seeing what they changed. One server for the module; each
test its own topic and group.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest

from cli_support import env, error_line, mqstore
from mqstore.testing.consumer_proc import ConsumerProcess
from endpoint_support import serving
from mqstore import MessageStore, load_config
from mqstore.endpoint.auth import now_date_time, signed_metadata

pytestmark = pytest.mark.usefixtures("no_plugin_env")
AK, SK = "app", "app-secret"  # a client's
ADMIN_AK, ADMIN_SK = "ops", "ops-secret"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def served(tmp_path_factory, home):
    with serving(tmp_path_factory.mktemp("served"), home,
                 server={"grpc_access_keys": [f"{AK}:{SK}"],
                         "grpc_admin_keys": [f"{ADMIN_AK}:{ADMIN_SK}"]}) as server:
        yield server


def admin(served, *args, check: int = 0, key: tuple[str, str] = (ADMIN_AK, ADMIN_SK)):
    """``mqstore ARGS --server`` the served store, signed with admin key ``key``."""
    return mqstore(*args, "--server", served.endpoint, "--admin-access-key", key[0],
                   "--admin-secret-key", key[1], check=check)


def admin_json(served, *args):
    return json.loads(admin(served, *args, "--json").stdout)


def on_directory(served, *args):
    """``mqstore ARGS ROOT --json`` on the served store's directory, beside the server."""
    return json.loads(mqstore(*args, "-c", served.yaml, "--json").stdout)


def maxima(served, topic: str, total: int) -> dict[int, int]:
    """``{queue id: max offset}`` of ``topic`` once its queues hold ``total`` messages
    (dispatch is asynchronous), read beside the server."""
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    deadline = time.monotonic() + WAIT_S
    while True:
        with MessageStore.open(served.root, config=config, read_only=True) as store:
            got = {q: store.max_offset(topic, q) for q in store.queue_ids(topic)}
        if sum(got.values()) >= total or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def stored_times(served, topic: str) -> dict[bytes, tuple[int, int, int]]:
    """``{body: (queue id, queue offset, store timestamp)}`` of every message of ``topic``."""
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    with MessageStore.open(served.root, config=config, read_only=True) as store:
        return {m.body: (m.queue_id, m.queue_offset, m.store_timestamp)
                for q in store.queue_ids(topic)
                for m in store.get("reader", topic, q, 0, 1000).messages}


def queue_of(receipt) -> int:
    """The queue the official producer's route picked (``broker.topic.queue``)."""
    return int(str(receipt.message_queue).rsplit(".", 1)[1])


def test_topics_made_through_the_server_are_routed_with_their_queue_counts(served, clients):
    made = admin_json(served, "topic", "create", "Routed", "-q", "3")
    assert made == {"topic": "Routed", "read_queues": 3, "write_queues": 3, "perm": 6,
                    "perm_text": "RW-", "order": False, "topic_sys_flag": 0,
                    "topic_filter_type": "SINGLE_TAG"}
    producer = clients.producer("Routed", ak=AK, sk=SK)
    sent = [producer.send(clients.message("Routed", b"r%d" % i)) for i in range(6)]
    assert {queue_of(r) for r in sent} == {0, 1, 2}
    before = maxima(served, "Routed", 6)
    assert set(before) <= {0, 1, 2} and sum(before.values()) == 6

    changed = admin_json(served, "topic", "update", "Routed", "-w", "1")
    assert (changed["read_queues"], changed["write_queues"], changed["perm"]) == (3, 1, 6)
    assert (changed["before"]["read_queues"], changed["before"]["write_queues"]) == (3, 3)
    # A client routing afterwards sees one write queue, and the store takes the sends there.
    producer = clients.producer("Routed", ak=AK, sk=SK)
    sent = [producer.send(clients.message("Routed", b"s%d" % i)) for i in range(4)]
    assert {queue_of(r) for r in sent} == {0}
    after = maxima(served, "Routed", 10)
    assert after == {**before, 0: before.get(0, 0) + 4}

    listed = admin_json(served, "topic", "list")
    config = {k: v for k, v in changed.items() if k != "before"}
    assert [r for r in listed if r["topic"] == "Routed"] == [
        {**config, "stored_queues": sorted(after)}]
    # The same rows the store directory gives, beside the server.
    assert listed == on_directory(served, "topic", "list", served.root)
    table = admin(served, "topic", "list").stdout
    assert "Routed" in table and "6 RW-" in table and "stored queues" in table


def test_groups_through_the_server_beside_live_consumers(served, clients):
    producer = clients.producer("Live", ak=AK, sk=SK)
    for i in range(8):
        producer.send(clients.message("Live", b"l%d" % i))
    ends = maxima(served, "Live", 8)
    queues = sorted(ends)
    # A SimpleConsumer through the endpoint (pop state in the served store) ...
    popper = clients.consumer("popper", {"Live": clients.mq.FilterExpression()}, ak=AK, sk=SK)
    assert len(clients.receive_all(popper, 8)) == 8
    # ... and a group consumer in another process, a live instance of group "live".
    consumer = ConsumerProcess(served.root, "live", "Live", "--timeout-ms", "200")
    try:
        assert consumer.wait_for(lambda c: sum(c.committed().values()) == 8), consumer.errors()
        rows = [r for r in admin_json(served, "group", "list") if r["topic"] == "Live"]
        assert rows == [
            {"group": "live", "topic": "Live", "queues": len(queues), "lag": 0,
             "live_instances": 1},
            {"group": "popper", "topic": "Live", "queues": len(queues), "lag": 0,
             "live_instances": 0}]
        (live,) = admin_json(served, "group", "describe", "live", "-t", "Live")
        assert (live["group"], live["lag"], live["live_instances"]) == ("live", 0, 1)
        assert [(q["queue_id"], q["committed_offset"], q["lag"]) for q in live["queues"]] == [
            (q, ends[q], 0) for q in queues]
        assert live == on_directory(served, "group", "describe", served.root, "live", "-t",
                                    "Live")[0]
        table = admin(served, "group", "describe", "live").stdout
        assert "group live on topic Live: lag 0, 1 live instance(s)" in table

        refused = admin(served, "group", "reset-offset", "live", "-t", "Live", "--offset", "0",
                        check=1)
        assert error_line(refused) == (
            "Error: group 'live' has live instances (1 on 'Live'): they would go on from the "
            "offsets they hold; stop them before resetting its offsets")
        refused = admin(served, "group", "delete", "live", "--yes", check=1)
        assert error_line(refused) == (
            "Error: group 'live' has live instances (1 on 'Live'): they would go on from the "
            "offsets they hold; stop them before deleting it")
    finally:
        assert consumer.stop() == 0, consumer.errors()
    reset = admin_json(served, "group", "reset-offset", "live", "-t", "Live", "--offset", "0")
    assert [(q["queue_id"], q["after"]) for q in reset["queues"]] == [(q, 0) for q in queues]
    gone = admin_json(served, "group", "delete", "popper", "-t", "Live", "--yes")
    assert gone == {"group": "popper", "topics": ["Live"]}
    assert [r["group"] for r in admin_json(served, "group", "list")
            if r["topic"] == "Live"] == ["live"]


def test_reset_by_time_through_the_server_then_a_consumer_resumes_exactly_there(served,
                                                                                clients):
    producer = clients.producer("Timed", ak=AK, sk=SK)
    for i in range(6):
        producer.send(clients.message("Timed", b"a%d" % i))
    maxima(served, "Timed", 6)
    time.sleep(0.05)  # what follows is stored later
    for i in range(6):
        producer.send(clients.message("Timed", b"b%d" % i))
    maxima(served, "Timed", 12)
    stored = stored_times(served, "Timed")
    t = min(ts for body, (_q, _o, ts) in stored.items() if body.startswith(b"b"))
    assert all(ts < t for body, (_q, _o, ts) in stored.items() if body.startswith(b"a"))

    group = {"Timed": clients.mq.FilterExpression()}
    first = clients.consumer("timed", group, ak=AK, sk=SK)
    assert len(clients.receive_all(first, 12)) == 12  # everything consumed and acknowledged
    reset = admin_json(served, "group", "reset-offset", "timed", "-t", "Timed", "--time", str(t))
    newest = {}
    for body, (q, offset, _ts) in sorted(stored.items(), key=lambda kv: kv[1]):
        if body.startswith(b"b"):
            newest.setdefault(q, offset)
    assert {q["queue_id"]: q["after"] for q in reset["queues"]} == {
        q["queue_id"]: newest.get(q["queue_id"], q["max_offset"]) for q in reset["queues"]}

    again = clients.consumer("timed", group, ak=AK, sk=SK)
    resumed = clients.receive_all(again, 6)
    assert sorted(m.body for m in resumed) == [b"b%d" % i for i in range(6)]
    assert again.receive(32, 30) == []  # nothing stored before the time comes back


def test_refusals_say_why_and_exit_as_on_a_closed_store(served):
    root = served.root
    refused = admin(served, "group", "list", key=("intruder", "x"), check=1)
    assert error_line(refused) == (f"Error: {served.endpoint} refused the call: access key "
                                   f"'intruder' is not one of server.grpc_admin_keys")
    refused = admin(served, "topic", "list", key=(ADMIN_AK, "wrong"), check=1)
    assert error_line(refused) == (f"Error: {served.endpoint} refused the call: the signature "
                                   f"of access key '{ADMIN_AK}' does not match its secret key")
    client = admin(served, "topic", "create", "NotByClients", key=(AK, SK), check=1)
    assert error_line(client) == (f"Error: {served.endpoint} refused the call: access key "
                                  f"'{AK}' is not one of server.grpc_admin_keys")

    admin(served, "topic", "create", "Refusing", "-q", "2")
    missing = admin(served, "topic", "update", "Unknown", "-q", "2", check=1)
    assert error_line(missing) == (f"Error: topic 'Unknown' has no config in "
                                   f"{root / 'config' / 'topics.json'}; create it with "
                                   f"`mqstore topic create`")
    missing = admin(served, "group", "reset-offset", "g", "-t", "Unknown", "--offset", "0",
                    check=1)
    assert error_line(missing) == (f"Error: topic 'Unknown' has no queues and no config in "
                                   f"{str(root)!r}")
    missing = admin(served, "group", "describe", "nobody", check=1)
    assert error_line(missing) == (f"Error: group 'nobody' has no offsets or pop state in "
                                   f"{str(root)!r}")
    twice = admin(served, "topic", "create", "Refusing", check=2)
    assert error_line(twice) == (
        "Error: topic 'Refusing' exists already (2 read / 2 write queue(s), perm 6); change it "
        "with `mqstore topic update`")
    bad = admin(served, "topic", "create", "no spaces", check=2)
    assert error_line(bad).startswith("Error: topic 'no spaces' must match")

    delete = admin(served, "topic", "delete", "Refusing", "--yes", check=1)
    assert error_line(delete) == (
        f"Error: a topic is deleted on a closed store: {str(root)!r} is open in `mqstore "
        f"serve`, whose dispatch worker writes its consume queues; stop serve, then run "
        f"`mqstore topic delete {root} Refusing`")
    assert "Refusing" in [r["topic"] for r in admin_json(served, "topic", "list")]
    delete = admin(served, "topic", "delete", "Unknown", "--yes", check=1)
    assert error_line(delete) == (f"Error: topic 'Unknown' does not exist in {str(root)!r}: "
                                  f"no config, no consume queue, no consumer group")

    both = mqstore("topic", "list", root, "--server", served.endpoint, check=2)
    assert "ROOT and --config apply to a store directory, not to --server" in both.stderr
    neither = mqstore("group", "list", check=2)
    assert "give ROOT, a store directory, or --server HOST:PORT" in neither.stderr
    nobody = mqstore("topic", "list", "--server", "127.0.0.1:1", check=1)
    assert error_line(nobody).startswith(
        "Error: 127.0.0.1:1: no `mqstore serve` endpoint answers there: ")


def test_the_admin_service_on_the_wire(served):
    """What another client of ``mqstore.admin.v1.Admin`` gets: JSON in and out, gRPC codes."""
    signed = signed_metadata(ADMIN_AK, ADMIN_SK, now_date_time())
    with grpc.insecure_channel(served.endpoint) as channel:
        def call(method: str, body: bytes, metadata=signed):
            return channel.unary_unary(f"/mqstore.admin.v1.Admin/{method}")(
                body, metadata=metadata, timeout=WAIT_S)

        made = json.loads(call("CreateTopic", b'{"name": "Wire", "queues": 2}'))
        assert made["write_queues"] == 2
        with pytest.raises(grpc.RpcError) as unknown:
            call("CreateSubscriptionGroup", b"{}")
        assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert unknown.value.details() == (
            "mqstore.admin.v1.Admin has no method 'CreateSubscriptionGroup'; it has "
            "ListTopics, CreateTopic, UpdateTopic, DeleteTopic, ListGroups, DescribeGroup, "
            "ResetOffset, DeleteGroup, GroupConfig, SetGroupConfig, ListDeadLetters, "
            "ResendDeadLetters, RoleStatus, Promote, Demote")
        with pytest.raises(grpc.RpcError) as unsigned:
            call("ListTopics", b"{}", metadata=())
        assert unsigned.value.code() is grpc.StatusCode.UNAUTHENTICATED
        for metadata in (signed_metadata(AK, SK, now_date_time()),  # a client's key
                         signed_metadata(ADMIN_AK, ADMIN_SK, "20200101T000000Z")):  # stale
            with pytest.raises(grpc.RpcError) as refused:
                call("DeleteGroup", b'{"group": "g"}', metadata=metadata)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as malformed:
            call("UpdateTopic", b'{"name": "Wire", "queues": "2", "colour": 1}')
        assert malformed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert malformed.value.details() == (
            "mqstore.admin.v1.Admin/UpdateTopic: bad request: queues: Input should be a valid "
            "integer; colour: Extra inputs are not permitted")
        with pytest.raises(grpc.RpcError) as missing:
            call("DescribeGroup", b'{"group": "nobody"}')
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        assert ("x-mqstore-error", "GroupNotFoundError") in [
            tuple(m) for m in missing.value.trailing_metadata()]
        changed = json.loads(call("UpdateTopic", b'{"name": "Wire", "perm": 4}'))
        assert changed["perm_text"] == "R--"


def test_the_old_key_options_still_sign_admin_calls(served):
    """``--access-key``/``--secret-key`` of the topic and group commands, as before, for a
    release: now an admin key, with a DeprecationWarning naming the new options."""
    old = mqstore("topic", "list", "--server", served.endpoint, "--access-key", ADMIN_AK,
                  "--secret-key", ADMIN_SK, "--json")
    assert isinstance(json.loads(old.stdout), list)
    proc = subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "topic", "list", "--server", served.endpoint,
         "--access-key", ADMIN_AK, "--secret-key", ADMIN_SK, "--json"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in env().items() if k != "PYTHONWARNINGS"})
    assert proc.returncode == 0, proc.stderr
    assert ("DeprecationWarning: option --access-key of the topic and group commands is now "
            "--admin-access-key (an admin key: server.grpc_admin_keys)") in proc.stderr


def test_a_damaged_topics_file_is_reported_as_on_the_directory(served):
    """Damaged data, not bad input (a CorruptStateError is a ValueError): exit 1 with the
    store's message either way, and the file is left as it is."""
    path = served.root / "config" / "topics.json"
    admin(served, "topic", "create", "Damaged", "-q", "1")
    good = path.read_bytes()
    path.write_bytes(good.replace(b'"topicConfigTable"', b'"topicConfigTabel"'))
    try:
        deadline = time.monotonic() + WAIT_S  # the server looks at the file once a second
        while True:
            through = admin(served, "topic", "list", check=None)
            if through.returncode != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert through.returncode == 1, through.stdout
        beside = mqstore("topic", "list", served.root, "-c", served.yaml, check=1)
        assert error_line(through) == error_line(beside)
        assert str(path) in error_line(through)
        assert path.read_bytes() != good  # reported, never reset
    finally:
        path.write_bytes(good)
