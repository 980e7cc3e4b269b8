"""QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15) and the offset a pull commits:
``ConsumerManageProcessor`` over the store's committed offsets
(``config/consumerOffset.json``, the same table the store's own group consumers use, so
``mqstore group describe`` shows a RocketMQ client's progress).

A query for a queue the group has no offset in answers 0 when the queue still starts at
offset 0 and holds a message (a new group reads from the start, as the broker answers when
offset 0 is still in memory), else QUERY_NOT_FOUND: the client then starts where its
consumeFromWhere says.

``Offsets`` remembers what it committed, so a consumer that commits the same offset every few
seconds (each pull carries one) writes the journal only when it moved.
"""

from __future__ import annotations

from mqstore.format.remoting_frame import Command
from mqstore.remoting.codes import RemotingError, Req, Resp
from mqstore.remoting.fields import Fields

MAX_REMEMBERED = 1 << 16


class Offsets:
    def __init__(self, store) -> None:
        self._store = store
        self._last: dict[tuple[str, str, int], int] = {}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = (group, topic, queue_id)
        if offset < 0 or self._last.get(key) == offset:
            return
        try:
            self._store.commit_consumer_offsets(group, topic, {queue_id: offset})
        except ValueError as exc:
            raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None
        if len(self._last) >= MAX_REMEMBERED:
            self._last.clear()
        self._last[key] = offset

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        try:
            return self._store.committed_offsets(group, topic).get(queue_id)
        except ValueError as exc:
            raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None


def handle_query(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    group, topic, queue_id = f.text("consumerGroup"), f.text("topic"), f.int32("queueId")
    offset = broker.offsets.query(group, topic, queue_id)
    if offset is None:
        store = broker.store
        if store.min_offset(topic, queue_id) <= 0 and store.max_offset(topic, queue_id) > 0:
            offset = 0
        else:
            return cmd.response(Resp.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this "
                                                      "group consumer boot first")
    return cmd.response(Resp.SUCCESS, None, {"offset": str(offset)})


def handle_update(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    group, topic = f.text("consumerGroup"), f.text("topic")
    queue_id, offset = f.int32("queueId"), f.int64("commitOffset")
    broker.offsets.commit(group, topic, queue_id, offset)
    return cmd.response(Resp.SUCCESS)


def handlers(broker) -> dict:
    return {Req.QUERY_CONSUMER_OFFSET: handle_query, Req.UPDATE_CONSUMER_OFFSET: handle_update}


__all__ = ["handlers", "Offsets"]
