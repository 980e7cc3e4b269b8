"""Prometheus metrics of an open, writable store, read at every scrape.

``StoreCollector`` yields one family per gauge or counter from the store's own positions and
status calls; nothing is sampled between scrapes. Families come from the functions in
``StoreCollector.sources``, one per concern (puts, commit log, flush, dispatch, queues,
consumer groups, workers, disk); a new concern is one more source, with no change to the
others.
"""

from __future__ import annotations

import logging

from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from mqstore.runtime import cleanup
from mqstore.consumer import CorruptStateError
from mqstore.consumer.dead_letters import DLQ_PREFIX
from mqstore.ops.consumer_lag import group_lags
from mqstore.running_flags import DISK_FULL, NOT_WRITEABLE

log = logging.getLogger(__name__)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class StoreCollector(Collector):
    def __init__(self, store) -> None:
        self.store = store
        self.sources = (self._puts, self._commit_log, self._flush, self._dispatch,
                        self._queues, self._consumers, self._workers, self._disk,
                        self._replication, self._schedule, self._transactions,
                        self._coordination, self._dead_letters)

    def collect(self):
        if self.store._state.closed:
            return
        for source in self.sources:
            yield from source()

    def _puts(self):
        puts = self.store.put_counts()
        yield _counter("mqstore_put_messages", "Messages stored by puts.", puts.messages)
        yield _counter("mqstore_put_bytes", "Commit-log bytes written by puts.", puts.bytes)
        yield _counter("mqstore_put_refused", "Put calls refused with a status.", puts.refused)

    def _commit_log(self):
        s = self.store
        yield _gauge("mqstore_commit_log_min_offset_bytes", "First stored commit-log byte.",
                     max(s.min_phys_offset, 0))
        yield _gauge("mqstore_commit_log_max_offset_bytes", "End of the readable commit log.",
                     s.max_phys_offset)
        flags = s.running_flags
        yield _gauge("mqstore_writable", "1 while the store accepts puts.",
                     0 if flags & (NOT_WRITEABLE | DISK_FULL) else 1)
        yield _gauge("mqstore_disk_full", "1 while puts are refused for disk space.",
                     1 if flags & DISK_FULL else 0)

    def _flush(self):
        status = self.store.internals.flush_client.status()
        yield _gauge("mqstore_flushed_offset_bytes", "End of the commit-log bytes on disk.",
                     status["flushed"])
        yield _gauge("mqstore_flush_lag_bytes", "Written commit-log bytes not yet on disk.",
                     max(0, self.store.max_phys_offset - status["flushed"]))
        fsync = SummaryMetricFamily("mqstore_fsync_seconds",
                                    "fdatasync calls of the flush loop and their duration.",
                                    count_value=status["fsyncs"],
                                    sum_value=status["fsync_seconds"])
        yield fsync

    def _dispatch(self):
        yield _gauge("mqstore_dispatch_lag_bytes",
                     "Visible commit-log bytes not yet in the consume queues and index.",
                     self.store.dispatch_behind_bytes())

    def _queues(self):
        depth = GaugeMetricFamily("mqstore_queue_depth_messages",
                                  "Messages stored in a queue (max - min offset).",
                                  labels=["topic", "queue_id"])
        high = GaugeMetricFamily("mqstore_queue_max_offset", "A queue's next offset.",
                                 labels=["topic", "queue_id"])
        low = GaugeMetricFamily("mqstore_queue_min_offset", "A queue's first stored offset.",
                                labels=["topic", "queue_id"])
        s = self.store
        for topic in s.topics():
            for qid in s.queue_ids(topic):
                lo, hi = s.min_offset(topic, qid), s.max_offset(topic, qid)
                labels = [topic, str(qid)]
                depth.add_metric(labels, hi - lo)
                high.add_metric(labels, hi)
                low.add_metric(labels, lo)
        yield from (depth, high, low)

    def _schedule(self):
        status = self.store.schedule_status()
        if status is None:
            return
        pending = GaugeMetricFamily("mqstore_scheduled_pending_messages",
                                    "Delayed messages of a level not yet delivered.",
                                    labels=["level"])
        for level in range(1, status["levels"] + 1):  # every level, 0 when none waits
            pending.add_metric([str(level)], status["pending"].get(level, 0))
        yield pending
        yield _gauge("mqstore_timers_pending_messages", "Timed messages (delivery times) not "
                     "yet delivered.", status["timers_pending"])
        yield _counter("mqstore_scheduled_delivered", "Delayed and timed messages delivered "
                       "to their topics since the store opened.", status["delivered"])

    def _transactions(self):
        status = self.store.transaction_status()
        if status is None:
            return
        yield _gauge("mqstore_transactions_open", "Transactions neither committed, rolled "
                     "back nor discarded (docs/transactions.md).", status["open"])
        for name, doc in (("committed", "committed"), ("rolled_back", "rolled back"),
                          ("checks", "checked back (halves re-appended)"),
                          ("discarded", "discarded after store.transaction_check_max checks")):
            yield _counter(f"mqstore_transactions_{name}", f"Transactions {doc} since the "
                           f"store opened.", status[name])

    def _consumers(self):
        # Reads the offset table once and each group's first unconsumed message per queue:
        # no more than a stats run, and nothing written (ops.consumer_lag).
        labels = ["group", "topic", "queue_id"]
        lag = GaugeMetricFamily("mqstore_consumer_lag_messages", "Messages of a queue a "
                                "consumer group has not consumed (max - committed offset).",
                                labels=labels)
        age = GaugeMetricFamily("mqstore_consumer_oldest_unconsumed_age_seconds",
                                "Store-clock age of the first message of a queue a consumer "
                                "group has not consumed (0: none).", labels=labels)
        try:
            groups = group_lags(self.store)
        except CorruptStateError as exc:  # the other families still reach the scrape
            log.warning("consumer lag not exported: %s", exc)
            groups = []
        for group in groups:
            for q in group.queues:
                names = [group.group, group.topic, str(q.queue_id)]
                lag.add_metric(names, q.lag)
                age.add_metric(names, q.oldest_unconsumed_age_ms / 1000)
        yield from (lag, age)

    def _dead_letters(self):
        # Derived from the DLQ itself (its queue's max offset: every dead letter it recorded,
        # whoever wrote it), so it survives restarts and counts remoting's and gRPC's alike.
        dead = CounterMetricFamily("mqstore_dead_letters", "Messages written to a consumer "
                                   "group's dead-letter queue (%DLQ%<group>), derived from "
                                   "the DLQ's consume queue.", labels=["group"])
        for topic in self.store.topics():
            if topic.startswith(DLQ_PREFIX) and 0 in self.store.queue_ids(topic):
                dead.add_metric([topic[len(DLQ_PREFIX):]], self.store.max_offset(topic, 0))
        yield dead

    def _workers(self):
        up = GaugeMetricFamily("mqstore_worker_up", "1 while a loop's worker (or thread) "
                               "runs.", labels=["worker"])
        restarts = CounterMetricFamily("mqstore_worker_restarts", "Worker processes "
                                       "restarted after dying.", labels=["worker"])
        for name, status in (("dispatch", self.store.worker_status()),
                             ("flush", self.store.internals.flush_client.status())):
            up.add_metric([name], 1 if status["alive"] else 0)
            restarts.add_metric([name], status.get("restarts", 0))
        yield from (up, restarts)

    def _disk(self):
        yield _gauge("mqstore_disk_used_ratio", "Used share of the store's file system, as "
                     "the cleanup policy sees it.", cleanup.disk_used_ratio(self.store.root))

    def _replication(self):
        """A master: each slave's acknowledged offset and lag; a slave: its master's."""
        replication = self.store.replication
        if replication is None:
            return
        status = replication.status()
        if replication.is_slave:
            yield _gauge("mqstore_replication_master_connected",
                         "1 while a slave is connected to its master.",
                         1 if status["connected"] else 0)
            yield _gauge("mqstore_replication_master_offset_bytes",
                         "The master's commit-log end, as the slave last heard it.",
                         status["master_offset"])
            yield _gauge("mqstore_replication_lag_bytes",
                         "Commit-log bytes the master holds and the slave does not yet.",
                         status["lag_bytes"])
            return
        slaves = status["slaves"]
        yield _gauge("mqstore_replication_slaves", "Slaves connected to this master.",
                     len(slaves))
        ack = GaugeMetricFamily("mqstore_replication_slave_ack_offset_bytes",
                                "The commit-log offset a slave acknowledged last.",
                                labels=["slave"])
        lag = GaugeMetricFamily("mqstore_replication_slave_lag_bytes",
                                "Commit-log bytes this master holds past a slave's "
                                "acknowledgement.", labels=["slave"])
        for slave in slaves:
            ack.add_metric([slave["address"]], slave["ack_offset"])
            lag.add_metric([slave["address"]], slave["lag_bytes"])
        yield from (ack, lag)

    def _coordination(self):
        """Automatic failover (``ops.failover``): who leads, in which epoch, and whether this
        node may write now; nothing without coordination."""
        status = self.store.coordination_status
        if status is None:
            return
        yield _gauge("mqstore_coordination_leading",
                     "1 while this node holds the cluster's leader key in etcd.",
                     1 if status["leading"] else 0)
        yield _gauge("mqstore_coordination_may_write",
                     "1 while this node's lease lets it take puts (its write deadline ahead).",
                     1 if status["may_write"] else 0)
        yield _gauge("mqstore_coordination_epoch",
                     "The epoch of the cluster's leader as this node last read it (0: none).",
                     status["leader_epoch"] or 0)
        leader = GaugeMetricFamily("mqstore_coordination_leader",
                                   "1 for the node that leads the cluster, as this node last "
                                   "read etcd.", labels=["leader"])
        if status["leader"] is not None:
            leader.add_metric([status["leader"]], 1)
        yield leader
