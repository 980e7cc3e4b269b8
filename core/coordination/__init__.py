"""Automatic failover's coordination on etcd: a leader key held under a lease, fencing by the
holder's own clock, epochs handed out by etcd, a registry of members, and elections of the
most caught-up member (docs/replication.md, "Automatic failover with etcd").

etcd decides; nothing here votes. This package imports nothing of the store (a contract says
so), and only it imports ``etcd3gw`` (the ``ha`` extra).

The interface the store and ``mqstore serve`` use::

    from mqstore.coordination import Coordinator, CoordinationSettings

    coordinator = Coordinator(
        CoordinationSettings.of(config.coordination),
        role="slave",                       # what this node is now, as published
        offset=store.max_offset,            # its commit log's end
        addresses={"ha": "10.0.0.2:10912", "grpc": "10.0.0.2:8081"},  # what others dial
        on_elected=promote,                 # (epoch: int): this node won; it may write from now
        on_fenced=demote,                   # (reason: str): it must stop writing (it already
                                            # cannot: may_write() is False before this runs)
        on_leader_changed=follow,           # (LeaderInfo | None): whom to replicate from;
                                            # LeaderInfo.member.addresses says where it is
        bootstrap=True,                     # False: it does not stand in the cluster's first
                                            # election (a configured slave)
        known_epoch=3,                      # its store's newest epoch: it wins above it
    )
    coordinator.start()                     # threads; never blocks on etcd, never raises for it
    coordinator.may_write()                 # on every put: the clock against the deadline
    coordinator.publish(offset=end)         # as the log grows (written every renew_interval)
    coordinator.publish(confirmed_offset=n) # leader: every PUT_OK so far covers [0, n)
    coordinator.publish(role="master")      # after a promotion
    coordinator.publish(known_epoch=n)      # the store learnt of a newer epoch
    coordinator.epoch                       # the epoch this node leads in, else None
    coordinator.step_down()                 # hand leadership over (sits out the next election)
    coordinator.withdraw("why")             # stand in no election until withdraw(None)
    coordinator.status()                    # for /healthz and stats: leader, deadline, errors
    coordinator.stop()                      # steps down, removes this node's keys

What the store must do in return:

* refuse a put unless ``may_write()`` holds, checked before the first byte is appended, and
  answer PUT_OK only if it still holds once the put is stored (the safety margin covers a put
  that passed the first check just before the deadline);
* on ``on_elected(epoch)``: become master in that epoch (RocketMQ's epoch file: append
  ``(epoch, max offset)``), then publish ``role`` and keep ``confirmed_offset`` current;
* on ``on_fenced(reason)``: stop being master (pending SYNC_MASTER puts must not answer
  PUT_OK); the node follows whoever wins next, which may be itself with a new epoch;
* on ``on_leader_changed(leader)``: a slave dials ``leader.member.addresses`` (``None``: no
  leader yet, keep what it has); an epoch below one seen before is never followed (epochs
  only grow here);
* publish ``offset`` as the log grows: candidates are ranked by it.

Callbacks run one at a time, in order, on the ``mqstore-coordination-events`` thread; a slow
one delays the next callback, never a keepalive or the fencing.

Modules: ``settings`` (the section in seconds, the fencing clock), ``etcd`` (the client over
the JSON gateway), ``records`` (keys and records), ``election`` (who may campaign),
``lease`` (``LeaderLease``), ``events`` (the callbacks' thread), ``coordinator``.
"""

from mqstore.coordination.coordinator import Coordinator
from mqstore.coordination.election import best_candidate
from mqstore.coordination.lease import LeaderLease
from mqstore.coordination.records import ClusterView, LeaderInfo, MemberInfo
from mqstore.coordination.settings import CoordinationSettings, now

__all__ = ["Coordinator", "LeaderLease", "CoordinationSettings", "LeaderInfo", "MemberInfo",
           "ClusterView", "best_candidate", "now"]
