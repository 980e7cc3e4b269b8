"""RocketMQ's AllocateMessageQueueAveragely (``consumer.allocation: average``, the default).

Members, sorted, take consecutive runs of the sorted queues: with q queues and m members the
first ``q % m`` take ``q // m + 1``, the rest ``q // m``; with more members than queues the
last members take none.
"""

from __future__ import annotations

from mqstore.plugin_api import hookimpl


class AverageAllocation:
    def allocate(self, group, member, members, queue_ids):
        if member not in members or not queue_ids:
            return []
        index, n, m = members.index(member), len(queue_ids), len(members)
        mod = n % m
        bigger = mod > 0 and index < mod
        size = 1 if n <= m else n // m + 1 if bigger else n // m
        start = index * size if bigger else index * size + mod
        return [queue_ids[(start + i) % n] for i in range(min(size, n - start))]


@hookimpl(trylast=True)
def register_allocation_strategies(registry):
    registry.add("average", AverageAllocation)
