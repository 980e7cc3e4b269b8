"""Who may campaign (``election``, pure): the best live candidate by offset, priority, name;
nobody who lacks data the leader confirmed; nobody who does not stand."""

from __future__ import annotations

from mqstore.coordination.election import best_candidate, why_not
from mqstore.coordination.records import ClusterView, LeaderInfo, MemberInfo


def view(*members: MemberInfo, confirmed: int = 0, leader: LeaderInfo | None = None):
    return ClusterView(revision=10, leader=leader, leader_raw=None, epoch=3,
                       epoch_mod_revision=5, members={m.name: m for m in members},
                       confirmed=confirmed, confirmed_mod_revision=0)


def m(name: str, offset: int, priority: int = 1, candidate: bool = True) -> MemberInfo:
    return MemberInfo(name, "slave", offset, priority, candidate)


def test_the_highest_offset_wins_then_priority_then_the_smallest_name():
    assert best_candidate(view(m("a", 100), m("b", 200), m("c", 150)), 0).name == "b"
    assert best_candidate(view(m("a", 200, 1), m("b", 200, 5), m("c", 100, 9)), 0).name == "b"
    assert best_candidate(view(m("b", 200), m("c", 200), m("a", 200)), 0).name == "a"


def test_a_behind_node_waits_for_the_caught_up_one():
    v = view(m("a", 1000), m("b", 900, priority=9))
    assert why_not(v, "a", 0) is None
    assert why_not(v, "b", 0) == "a is a better candidate (offset 1000, priority 1)"


def test_nobody_behind_the_confirmed_offset_campaigns_even_alone():
    v = view(m("b", 900), confirmed=1000)
    assert best_candidate(v, 0) is None
    assert why_not(v, "b", 0) == ("its offset 900 is 100 bytes behind the leader's confirmed "
                                  "offset 1000 (allowed: 0)")
    assert why_not(v, "b", 100) is None  # within max_lag_bytes
    both = view(m("b", 900, priority=5), m("c", 1000), confirmed=1000)
    assert best_candidate(both, 0).name == "c"
    assert best_candidate(view(m("b", 1000), confirmed=1000), 0).name == "b"


def test_members_that_do_not_stand_are_skipped():
    v = view(m("a", 1000, priority=0, candidate=False), m("b", 500))
    assert best_candidate(v, 0).name == "b"
    assert why_not(v, "a", 0) == "it does not stand (priority 0, or it stepped down)"


def test_no_campaign_while_a_leader_holds_the_key_or_before_registering():
    led = view(m("a", 1000), leader=LeaderInfo("z", 3, 77))
    assert why_not(led, "a", 0) == "z leads (epoch 3)"
    assert why_not(view(m("a", 1000)), "b", 0) == "its member record is not in etcd yet"
