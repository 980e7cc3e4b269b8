"""Coordinators against a real etcd: elections of the best candidate, failover when the leader
dies or is stopped, fencing and no promotion while etcd is down, elections again after."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from coordination_support import fast
from mqstore.coordination.etcd import EtcdClient
from mqstore.coordination.records import Keys
from mqstore.testing import wait_for


@pytest.fixture
def observer(etcd):
    client = EtcdClient([etcd.endpoint], budget_s=5.0)
    yield client
    client.close()


def leader_of(client, cluster):
    kvs = client.range(Keys(cluster).leader)[1]
    return json.loads(kvs[0].value) if kvs else None


def leader_name(node):
    leaders = node.recorder.kinds("leader")
    return leaders[-1].name if leaders and leaders[-1] is not None else None


def members(client, cluster):
    prefix = Keys(cluster).prefix + "members/"
    return {kv.key.removeprefix(prefix) for kv in client.range(prefix, prefix=True)[1]}


def first_leader(coordinators, settings, observer, cluster, **changes):
    """A node elected alone (epoch 1): the others join as its followers."""
    z = coordinators(settings("z", **changes), offset=0)
    wait_for(lambda: z.epoch == 1, what="z elected alone")
    return z


def test_the_most_caught_up_member_wins_and_everyone_learns_where_it_is(coordinators,
                                                                        settings, observer,
                                                                        cluster):
    z = first_leader(coordinators, settings, observer, cluster)
    a = coordinators(settings("a", priority=5), offset=100, addresses={"ha": "10.0.0.1:1"})
    c = coordinators(settings("c"), offset=300, addresses={"ha": "10.0.0.3:1"})
    b = coordinators(settings("b"), offset=200, addresses={"ha": "10.0.0.2:1"})
    wait_for(lambda: members(observer, cluster) == {"a", "b", "c", "z"}, what="all registered")
    z.stop()
    wait_for(lambda: c.epoch == 2, what="c elected")
    assert c.recorder.kinds("elected") == [2] and c.may_write()
    for node in (a, b, c):
        wait_for(lambda: leader_name(node) == "c", what=f"{node.settings.node} sees c lead")
        info = node.recorder.kinds("leader")[-1]
        assert (info.epoch, info.member.addresses) == (2, {"ha": "10.0.0.3:1"})
        assert [i.name for i in node.recorder.kinds("leader") if i] == ["z", "c"]
    assert a.recorder.kinds("elected") == b.recorder.kinds("elected") == []
    assert not a.may_write() and not b.may_write()
    status = c.status()
    assert (status["leader"], status["leading"], status["epoch"]) == ("c", True, 2)
    assert 0 < status["writable_for_ms"] <= 2000 - 500
    assert (a.status()["leader"], a.status()["leading"], a.status()["epoch"]) == ("c", False,
                                                                                  None)


def test_a_behind_node_does_not_campaign_while_a_caught_up_one_lives(coordinators, settings,
                                                                     observer, cluster):
    z = first_leader(coordinators, settings, observer, cluster)
    a = coordinators(settings("a"), offset=1000)
    b = coordinators(settings("b", priority=9), offset=500)  # behind, whatever its priority
    wait_for(lambda: members(observer, cluster) == {"a", "b", "z"}, what="all registered")
    z.stop()
    wait_for(lambda: a.epoch == 2, what="the caught-up a elected")
    assert b.recorder.kinds("elected") == []
    assert leader_of(observer, cluster)["name"] == "a"
    a.stop()  # the only candidate left is b, behind no confirmed offset: it campaigns
    wait_for(lambda: b.epoch == 3, what="b elected once a is gone")


def test_a_leader_that_steps_down_hands_over_though_it_is_ahead(coordinators, settings):
    a = coordinators(settings("a"), offset=2000)
    wait_for(lambda: a.epoch == 1, what="a elected")
    b = coordinators(settings("b"), offset=1000)
    wait_for(lambda: leader_name(b) == "a", what="b follows a")
    assert a.step_down()
    assert not a.may_write()
    wait_for(lambda: b.epoch == 2, what="b elected")
    assert a.recorder.kinds("elected") == [1]
    assert wait_for(lambda: a.recorder.kinds("fenced")) == ["stepped down"]
    wait_for(lambda: leader_name(a) == "b", what="a follows b")


def test_a_node_that_stepped_down_sits_out_one_election(coordinators, settings):
    a = coordinators(settings("a"), offset=2000)
    wait_for(lambda: a.epoch == 1, what="a elected")
    assert a.step_down()
    # Alone, it would win again at once; it gives others one TTL to take over first.
    wait_for(lambda: "stepped down" in str(a.waiting_for),
             what="a sitting out")
    assert a.recorder.kinds("elected") == [1]
    wait_for(lambda: a.epoch == 2, what="a elected again after sitting out")


def test_a_node_behind_the_confirmed_offset_never_campaigns(coordinators, settings, observer,
                                                            cluster):
    leader = coordinators(settings("a"), offset=5000)
    wait_for(lambda: leader.epoch == 1, what="a elected")
    leader.publish(confirmed_offset=4000)
    wait_for(lambda: observer.range(Keys(cluster).confirmed)[1], what="confirmed published")
    slave = coordinators(settings("b"), offset=3999)
    wait_for(lambda: leader_name(slave) == "a", what="b follows a")
    leader.stop()  # its keys go at once
    wait_for(lambda: "behind the leader's confirmed offset 4000" in str(slave.waiting_for),
             what="b refusing to campaign")
    assert leader_of(observer, cluster) is None and slave.recorder.kinds("elected") == []
    slave.publish(offset=4000)  # caught up with what was acknowledged
    wait_for(lambda: slave.epoch == 2, what="b elected once it holds the confirmed offset")


def test_the_confirmed_offset_only_grows(coordinators, settings, observer, cluster):
    leader = coordinators(settings("a"), offset=5000)
    wait_for(lambda: leader.epoch == 1, what="a elected")
    leader.publish(confirmed_offset=4000)
    key = Keys(cluster).confirmed
    wait_for(lambda: observer.range(key)[1], what="confirmed published")
    leader.publish(confirmed_offset=3000)  # never lowers it
    leader.publish(confirmed_offset=4500)
    wait_for(lambda: json.loads(observer.range(key)[1][0].value)["offset"] == 4500,
             what="confirmed raised")
    assert json.loads(observer.range(key)[1][0].value) == {"offset": 4500, "epoch": 1,
                                                           "leader": "a"}


@pytest.mark.slow
def test_a_killed_leader_is_replaced_with_the_next_epoch(coordinators, settings, node_procs):
    holder = node_procs(settings("a"), offset=1000)
    wait_for(lambda: holder.of("elected"), timeout=60, what="the process elected")
    epoch = holder.of("elected")[0]["epoch"]
    follower = coordinators(settings("b"), offset=1000)
    wait_for(lambda: leader_name(follower) == "a", what="b follows a")
    holder.proc.send_signal(signal.SIGKILL)
    wait_for(lambda: follower.epoch == epoch + 1, timeout=60, what="b elected")
    wait_for(lambda: leader_name(follower) == "b", what="b seeing itself lead")
    assert [i.name if i else None for i in follower.recorder.kinds("leader")] == ["a", None, "b"]


@pytest.mark.slow
def test_a_stopped_holder_finds_itself_fenced_on_resuming(coordinators, settings, node_procs,
                                                          observer, cluster):
    holder = node_procs(settings("a"), offset=1000)
    wait_for(lambda: holder.of("elected"), timeout=60, what="the process elected")
    epoch = holder.of("elected")[0]["epoch"]
    wait_for(lambda: holder.of("may_write") and holder.of("may_write")[-1]["value"],
             what="the process writable")
    other = coordinators(settings("b"), offset=1000)
    wait_for(lambda: leader_name(other) == "a", what="b follows a")
    os.kill(holder.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: other.epoch == epoch + 1, timeout=60, what="b elected meanwhile")
    finally:
        os.kill(holder.proc.pid, signal.SIGCONT)
    resumed = wait_for(lambda: holder.of("resumed"), what="the process resumed")
    assert resumed[0]["may_write"] is False  # its first check after SIGCONT
    wait_for(lambda: holder.of("fenced"), what="on_fenced in the process")
    after = holder.events[holder.events.index(resumed[0]):]
    assert not [e for e in after if e["event"] == "may_write" and e["value"]]
    assert not [e for e in after if e["event"] == "elected"]
    assert leader_of(observer, cluster) == {"name": "b", "epoch": epoch + 1,
                                            "lease": str(other.lease.lease_id)}


@pytest.mark.slow
def test_etcd_down_fences_the_leader_and_promotes_nobody_until_it_returns(coordinators,
                                                                          own_etcd, cluster):
    first = coordinators(fast([own_etcd.endpoint], cluster, "a"), offset=1000)
    second = coordinators(fast([own_etcd.endpoint], cluster, "b"), offset=1000)
    # Equal offsets and priorities: whichever campaigns first wins (a loaded machine may
    # start b's first round before a's); a is the leader from here on, b the other.
    a = wait_for(lambda: next((c for c in (first, second) if c.epoch == 1), None),
                 what="a node elected")
    b = second if a is first else first
    wait_for(lambda: leader_name(b) == a.settings.node, what="the other follows the leader")
    own_etcd.kill()
    reason = wait_for(lambda: a.recorder.kinds("fenced"), timeout=30, what="a fenced")[0]
    assert "not renewed before its write deadline" in reason
    assert not a.may_write()
    wait_for(lambda: b.last_error and "etcd unreachable" in b.last_error,
             what="b seeing etcd down")
    assert b.recorder.kinds("elected") == [] and not b.may_write()
    elected_before = len(a.recorder.kinds("elected"))
    own_etcd.start()

    def elections() -> int:  # since etcd returned; the event is recorded after the epoch is set
        return len(a.recorder.kinds("elected")) - elected_before + len(b.recorder.kinds("elected"))

    wait_for(elections, timeout=60, what="an election after etcd returned")
    assert elections() == 1 and 2 in (a.epoch, b.epoch)
    assert [a.may_write(), b.may_write()].count(True) == 1


@pytest.mark.slow
def test_a_restarted_node_revokes_the_key_its_killed_process_left(coordinators, settings,
                                                                  node_procs, observer,
                                                                  cluster):
    # The killed process held a 60 s lease: without the revoke, no election for a minute.
    holder = node_procs(settings("a", ttl_s=60, renew_s=1.0, retry_s=1.5, margin_s=1.0),
                        offset=1000)
    wait_for(lambda: holder.of("elected"), timeout=60, what="the process elected")
    old = leader_of(observer, cluster)
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    killed = time.monotonic()
    b = coordinators(settings("b"), offset=1000)
    a = coordinators(settings("a"), offset=1000)  # the same node, started again
    wait_for(lambda: (a.epoch or b.epoch) == old["epoch"] + 1, timeout=50,
             what="an election once the stale key is revoked")
    assert observer.keepalive(int(old["lease"])) is None  # revoked, not expired:
    assert time.monotonic() - killed < 60


def test_a_node_that_does_not_bootstrap_waits_for_the_first_election_then_stands(
        coordinators, settings, observer, cluster):
    slave = coordinators(settings("a"), offset=0, bootstrap=False)
    wait_for(lambda: "no election has happened in this cluster yet" in (
        slave.status()["waiting_for"] or ""), what="the slave waits for a first election")
    assert slave.epoch is None and leader_of(observer, cluster) is None
    z = coordinators(settings("z"), offset=0)
    wait_for(lambda: z.epoch == 1, what="z, which bootstraps, elected")
    wait_for(lambda: leader_name(slave) == "z", what="the slave sees z lead")
    z.stop()  # an election has happened: the slave stands from now on
    wait_for(lambda: slave.epoch == 2, what="the slave elected after z")
    assert slave.recorder.kinds("elected") == [2]


def test_an_election_hands_out_an_epoch_above_the_newest_the_store_knows(
        coordinators, settings, observer, cluster):
    a = coordinators(settings("a"), offset=0, known_epoch=6)
    wait_for(lambda: a.recorder.kinds("elected") == [7],
             what="a elected above its store's epoch 6")
    assert observer.range(Keys(cluster).epoch)[1][0].value == b"7"
    b = coordinators(settings("b"), offset=0)
    wait_for(lambda: leader_name(b) == "a", what="b follows a")
    assert a.step_down()
    wait_for(lambda: b.epoch == 8, what="b elected next: the epoch key + 1")
    a.publish(known_epoch=11)  # a's store heard of epoch 11 meanwhile: it publishes it

    def published() -> int:
        kvs = observer.range(Keys(cluster).member("a"))[1]
        return json.loads(kvs[0].value)["epoch"] if kvs else 0
    wait_for(lambda: published() == 11, what="a's record naming epoch 11")
    a.withdraw("the test keeps it out")
    b.step_down()  # b's store knows only 8, but a member's knows 11
    wait_for(lambda: b.epoch == 12, what="b elected again above 11")


def test_a_withdrawn_node_stands_in_no_election_until_it_stands_again(coordinators, settings,
                                                                      observer, cluster):
    z = first_leader(coordinators, settings, observer, cluster)
    a = coordinators(settings("a"), offset=1000)  # the best candidate, but withdrawn
    a.withdraw("its store refused the promotion in epoch 2")
    b = coordinators(settings("b"), offset=10)
    wait_for(lambda: members(observer, cluster) == {"a", "b", "z"}, what="all registered")
    z.stop()
    wait_for(lambda: b.epoch == 2, what="b elected: a does not stand")
    assert a.recorder.kinds("elected") == []
    b.stop()
    wait_for(lambda: "it withdrew from elections: its store refused the promotion in epoch 2"
             in (a.status()["waiting_for"] or ""), what="a says why it waits")
    a.withdraw(None)
    wait_for(lambda: a.epoch == 3, what="a elected once it stands again")
