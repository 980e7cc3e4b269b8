"""LeaderLease against a real etcd: acquire, renew, expire; the holder's own deadline passes
before etcd deletes the key; one winner per epoch; stepping down; a bad epoch key."""

from __future__ import annotations

import json
import threading

import pytest

from coordination_support import Recorder
from mqstore.coordination import LeaderLease, now
from mqstore.coordination.etcd import EtcdClient
from mqstore.coordination.records import Keys
from mqstore.errors import CoordinationError
from mqstore.testing import wait_for


@pytest.fixture
def leases():
    made: list[LeaderLease] = []

    def make(settings) -> LeaderLease:
        recorder = Recorder()
        lease = LeaderLease(settings, on_elected=recorder("elected"),
                            on_fenced=recorder("fenced"))
        lease.recorder = recorder
        lease.start()
        made.append(lease)
        wait_for(lease.can_campaign, what=f"{settings.node}'s lease granted")
        return lease

    yield make
    for lease in made:
        lease.stop()


@pytest.fixture
def observer(etcd):
    client = EtcdClient([etcd.endpoint], budget_s=5.0)
    yield client
    client.close()


def leader_record(observer, cluster):
    kvs = observer.range(Keys(cluster).leader)[1]
    return json.loads(kvs[0].value) if kvs else None


def test_acquire_takes_the_key_on_its_lease_and_renewals_keep_it(leases, settings, observer,
                                                                   cluster):
    lease = leases(settings("a"))
    assert not lease.may_write()
    assert lease.acquire() == 1
    assert lease.may_write() and lease.holding and lease.epoch == 1
    record = leader_record(observer, cluster)
    assert record == {"name": "a", "epoch": 1, "lease": str(lease.lease_id)}
    assert observer.range(Keys(cluster).epoch)[1][0].value == b"1"
    first_deadline = lease.writable_until()
    # Past the first deadline, and past the TTL itself: renewed, still writable, same term.
    wait_for(lambda: now() > first_deadline + lease.settings.ttl_s, timeout=30,
             what="a TTL past the first deadline")
    assert lease.may_write() and lease.writable_until() > first_deadline
    assert leader_record(observer, cluster) == record
    assert lease.recorder.events == [("elected", 1)]


def test_the_deadline_passes_before_etcd_deletes_the_key(leases, settings, observer, cluster,
                                                          proxies, etcd):
    proxy = proxies(etcd.endpoint)
    lease = leases(settings("a", endpoints=[proxy.endpoint]))
    assert lease.acquire() == 1
    revision, _ = observer.range(Keys(cluster).leader)
    proxy.cut()  # the holder can no longer renew; etcd runs on
    deleted_seen = None
    while deleted_seen is None:  # watch the key until etcd deletes it
        if observer.wait_change(Keys(cluster).leader, revision, wait_s=10):
            revision, kvs = observer.range(Keys(cluster).leader)
            if not kvs:
                deleted_seen = now()
    deadline = lease.writable_until()  # -inf once fenced: read the fence's own record
    fenced = wait_for(lambda: lease.recorder.kinds("fenced"), what="on_fenced")
    assert "not renewed before its write deadline" in fenced[0]
    assert not lease.may_write() and deadline == float("-inf")
    assert lease.fenced_deadline < deleted_seen


def test_two_nodes_racing_one_wins_and_the_epoch_grows_by_one(leases, settings, observer,
                                                              cluster):
    nodes = [leases(settings(name)) for name in ("a", "b", "c")]
    for round_ in (1, 2, 3):
        barrier = threading.Barrier(len(nodes))
        results: dict[str, int | None] = {}

        def campaign(node):
            barrier.wait()
            results[node.settings.node] = node.acquire()

        threads = [threading.Thread(target=campaign, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [name for name, epoch in results.items() if epoch is not None]
        assert len(winners) == 1, results
        assert results[winners[0]] == round_
        assert leader_record(observer, cluster)["name"] == winners[0]
        assert [n.may_write() for n in nodes].count(True) == 1
        winner = next(n for n in nodes if n.settings.node == winners[0])
        assert winner.step_down()
        wait_for(winner.can_campaign, what="a new lease after stepping down")


def test_step_down_revokes_at_once_and_fences_the_holder(leases, settings, observer, cluster):
    a, b = leases(settings("a")), leases(settings("b"))
    assert a.acquire() == 1
    assert b.acquire() is None  # held
    assert a.step_down() is True
    assert not a.may_write()
    assert leader_record(observer, cluster) is None  # revoked, not left to expire
    assert b.acquire() == 2
    assert wait_for(lambda: a.recorder.kinds("fenced")) == ["stepped down"]
    assert a.step_down() is False


def test_an_epoch_key_that_is_not_a_number_stops_elections(leases, settings, observer, cluster):
    observer.put(Keys(cluster).epoch, b"seven")
    lease = leases(settings("a"))
    with pytest.raises(CoordinationError, match=f"{Keys(cluster).epoch} holds 'seven', not an "
                                                f"epoch"):
        lease.acquire()
    assert leader_record(observer, cluster) is None and not lease.may_write()


def test_may_write_is_the_clocks_answer_whatever_the_threads_did(leases, settings):
    """A process paused past its deadline must not need a thread to run to know it: here the
    keeper and the watchdog are held off (their lock taken) while the deadline passes."""
    lease = leases(settings("a"))
    assert lease.acquire() == 1
    with lease._cond:  # no renewal, no fencing can run now
        deadline = lease.writable_until()
        assert lease.may_write()
        wait_for(lambda: now() > deadline, timeout=30, what="the deadline passed")
        assert lease.holding  # nothing fenced it...
        assert not lease.may_write()  # ...and yet it may not write
    fenced = wait_for(lambda: lease.recorder.kinds("fenced"), what="on_fenced")
    assert "not renewed before its write deadline" in fenced[0]


class SlowTxn(EtcdClient):
    """A client whose next txn is preceded by another node's whole election (its epoch read
    is then stale), as if this node had paused between reading the epoch and campaigning."""

    def __init__(self, endpoints, budget_s, other) -> None:
        super().__init__(endpoints, budget_s)
        self.other = other

    def txn(self, compare, success, failure=()):
        if self.other is not None:
            other, self.other = self.other, None
            assert other.acquire() is not None and other.step_down()
        return super().txn(compare, success, failure)


def test_an_election_on_a_stale_epoch_read_loses(leases, settings, observer, cluster, etcd):
    other = leases(settings("b"))
    stale = LeaderLease(settings("a"), client_factory=lambda: SlowTxn([etcd.endpoint], 2.0,
                                                                      other))
    stale.start()
    try:
        wait_for(stale.can_campaign, what="a's lease")
        # b won epoch 1 and let it go between a's read (epoch 0) and a's txn: the leader key is
        # absent again, but epoch 1 is taken, so a's txn for epoch 1 must fail.
        assert stale.acquire() is None
        assert observer.range(Keys(cluster).epoch)[1][0].value == b"1"
        assert leader_record(observer, cluster) is None
        assert stale.acquire() == 2
    finally:
        stale.stop()
