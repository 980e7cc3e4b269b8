"""Who may campaign when the leader key is gone: the best candidate among the live members.

Patroni's ``is_healthiest_node`` and RocketMQ's ``DefaultElectPolicy``, on what the members
published in etcd:

* a member is live while its record exists (it rides the member's lease);
* it is out when it does not stand (``candidate`` false: priority 0, or it just stepped down),
  and when it lacks acknowledged data: more than ``max_lag_bytes`` behind the last offset the
  leader published as covered by every PUT_OK (``confirmed``). With the default 0 a node that
  lacks any acknowledged byte never campaigns, whoever else is alive;
* the best of the rest: the highest offset, then the highest priority, then the smallest name
  (so every node that reads the same view names the same one).

A node campaigns only when it is that best candidate; the txn on the leader key then decides
between nodes that read different views. Pure: no I/O.
"""

from __future__ import annotations

from mqstore.coordination.records import ClusterView, MemberInfo


def rank(member: MemberInfo) -> tuple:
    return (-member.offset, -member.priority, member.name)


def lacks_confirmed(member: MemberInfo, confirmed: int, max_lag_bytes: int) -> bool:
    return confirmed - member.offset > max_lag_bytes


def best_candidate(view: ClusterView, max_lag_bytes: int) -> MemberInfo | None:
    eligible = [m for m in view.members.values()
                if m.candidate and not lacks_confirmed(m, view.confirmed, max_lag_bytes)]
    return min(eligible, key=rank, default=None)


def why_not(view: ClusterView, node: str, max_lag_bytes: int) -> str | None:
    """Why ``node`` does not campaign on ``view``, or None when it should."""
    if view.leader is not None:
        return f"{view.leader.name} leads (epoch {view.leader.epoch})"
    me = view.members.get(node)
    if me is None:
        return "its member record is not in etcd yet"
    if not me.candidate:
        return "it does not stand (priority 0, or it stepped down)"
    if lacks_confirmed(me, view.confirmed, max_lag_bytes):
        return (f"its offset {me.offset} is {view.confirmed - me.offset} bytes behind the "
                f"leader's confirmed offset {view.confirmed} (allowed: {max_lag_bytes})")
    best = best_candidate(view, max_lag_bytes)
    if best is not None and best.name != node:
        return f"{best.name} is a better candidate (offset {best.offset}, priority {best.priority})"
    return None


__all__ = ["best_candidate", "why_not", "rank", "lacks_confirmed"]
