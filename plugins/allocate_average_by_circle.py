"""RocketMQ's AllocateMessageQueueAveragelyByCircle (``consumer.allocation: average_by_circle``).

Queues are dealt out to the sorted members like cards: member i takes queues i, i + m, i + 2m...
"""

from __future__ import annotations

from mqstore.plugin_api import hookimpl


class CircleAllocation:
    def allocate(self, group, member, members, queue_ids):
        if member not in members:
            return []
        index, m = members.index(member), len(members)
        return [q for i, q in enumerate(queue_ids) if i % m == index]


@hookimpl(trylast=True)
def register_allocation_strategies(registry):
    registry.add("average_by_circle", CircleAllocation)
