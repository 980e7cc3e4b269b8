"""The etcd client against a real etcd: the JSON gateway's traps, endpoint failover, errors that
name the endpoint, and a watch that misses nothing after a read."""

from __future__ import annotations

import threading

import pytest

from etcd_support import free_port
from mqstore.coordination.etcd import EtcdClient, absent, holds, put, unchanged
from mqstore.errors import CoordinationError, CoordinationUnavailable


@pytest.fixture
def client(etcd):
    c = EtcdClient([etcd.endpoint], budget_s=2.0)
    yield c
    c.close()


def test_a_failed_txn_reads_as_failed_and_a_range_of_nothing_is_empty(client, cluster):
    key = f"/{cluster}/k"
    assert client.range(key)[1] == []  # no "kvs" in the answer
    first = client.txn([absent(key)], [put(key, b"one")])
    assert first.succeeded and first.revision > 0
    second = client.txn([absent(key)], [put(key, b"two")])  # no "succeeded" in the answer
    assert second.succeeded is False
    revision, kvs = client.range(key)
    assert [(kv.value, kv.create_revision, kv.mod_revision) for kv in kvs] == [
        (b"one", first.revision, first.revision)]
    assert revision >= first.revision
    assert client.txn([unchanged(key, first.revision), holds(key, b"one")],
                      [put(key, b"three")]).succeeded
    assert client.txn([holds(key + "-missing", b"")], [put(key, b"four")]).succeeded is False
    assert client.range(key)[1][0].value == b"three"


def test_keepalive_on_a_revoked_lease_says_none_and_revoke_twice_says_false(client, cluster):
    lease, ttl = client.grant(5)
    assert lease > 0 and ttl == 5  # int64s arrive as strings
    client.put(f"/{cluster}/on-lease", b"x", lease)
    assert client.keepalive(lease) == 5
    assert client.revoke(lease) is True
    assert client.range(f"/{cluster}/on-lease")[1] == []  # its keys went with it
    assert client.keepalive(lease) is None  # 200, no TTL, no error
    assert client.revoke(lease) is False


def test_etcd_grants_its_minimum_ttl_when_asked_less(client):
    lease, ttl = client.grant(1)
    assert ttl >= 2  # the minimum follows etcd's election timeout (1 s by default)
    client.revoke(lease)


def test_calls_fail_over_to_a_live_endpoint_and_stay_there(etcd, cluster):
    dead = f"127.0.0.1:{free_port()}"
    client = EtcdClient([dead, etcd.endpoint], budget_s=2.0)
    try:
        client.put(f"/{cluster}/k", b"v")
        assert client.endpoint == etcd.endpoint
        assert client.range(f"/{cluster}/k")[1][0].value == b"v"
        assert client.endpoint == etcd.endpoint
    finally:
        client.close()


def test_no_live_endpoint_names_every_endpoint_and_its_failure():
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    client = EtcdClient(dead, budget_s=2.0)
    with pytest.raises(CoordinationUnavailable) as err:
        client.range("/k")
    assert f"{dead[0]}: connection refused" in str(err.value)
    assert f"{dead[1]}: connection refused" in str(err.value)
    client.close()


def test_a_txn_is_not_sent_to_a_second_endpoint(etcd, cluster):
    """Its outcome would be unknown: the caller reads instead of sending it twice."""
    dead = f"127.0.0.1:{free_port()}"
    client = EtcdClient([dead, etcd.endpoint], budget_s=2.0)
    with pytest.raises(CoordinationUnavailable, match=dead):
        client.txn([absent(f"/{cluster}/t")], [put(f"/{cluster}/t", b"x")])
    assert client.range(f"/{cluster}/t")[1] == []
    assert client.endpoint == etcd.endpoint  # the next call goes to the other one
    client.close()


def test_etcd_refusing_a_call_names_the_endpoint(client, etcd, cluster):
    with pytest.raises(CoordinationError, match=f"etcd at {etcd.endpoint} refused the call: "
                                                 f".*lease not found"):
        client.put(f"/{cluster}/k", b"v", lease=12345)


def test_wait_change_sees_a_change_made_between_the_read_and_the_watch(client, cluster):
    key = f"/{cluster}/watched"
    revision, _ = client.range(key)
    client.put(key, b"changed")  # before the watch exists
    assert client.wait_change(key, revision, wait_s=5.0) is True
    revision, _ = client.range(key)
    assert client.wait_change(key, revision, wait_s=0.3) is False


def test_wait_change_wakes_when_the_key_changes(client, etcd, cluster):
    key = f"/{cluster}/watched"
    revision, _ = client.range(key)
    other = EtcdClient([etcd.endpoint], budget_s=2.0)
    started = threading.Event()

    def change():
        started.wait(5)
        other.put(key, b"v")

    thread = threading.Thread(target=change)
    thread.start()
    started.set()
    assert client.wait_change(key, revision, wait_s=30.0) is True
    thread.join()
    other.close()
