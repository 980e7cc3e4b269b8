"""Lookups by time, offset, id and key: SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), GET_EARLIEST_MSG_STORETIME (32) (``AdminBrokerProcessor``),
VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12) (``QueryMessageProcessor``).

29 to 32 answer in the header (``offset``, ``timestamp``); a queue the store does not have
answers 0 (29 to 31) or -1 (32), as the broker does. 33 and 12 answer with stored records,
byte for byte; a key query runs on a thread (it reads index files and records), the others on
the event loop. ``_UNIQUE_KEY_QUERY`` true asks for the message whose UNIQ_KEY (the client's
message id) is the key: the first stored, if a producer retried.
"""

from __future__ import annotations

import asyncio

from mqstore.format.remoting_frame import Command
from mqstore.remoting.codes import RemotingError, Req, Resp
from mqstore.remoting.fields import Fields

MAX_QUERY_MESSAGES = 64  # messageStoreConfig.maxMsgsNumBatch


def _queue(cmd: Command) -> tuple[str, int]:
    f = Fields(cmd.ext)
    return f.text("topic"), f.int32("queueId")


def handle_search_by_time(broker, conn, cmd: Command) -> Command:
    topic, queue_id = _queue(cmd)
    timestamp = Fields(cmd.ext).int64("timestamp")
    offset = broker.store.offset_by_time(topic, queue_id, timestamp)
    return cmd.response(Resp.SUCCESS, None, {"offset": str(offset)})


def handle_max_offset(broker, conn, cmd: Command) -> Command:
    topic, queue_id = _queue(cmd)
    return cmd.response(Resp.SUCCESS, None,
                        {"offset": str(broker.store.max_offset(topic, queue_id))})


def handle_min_offset(broker, conn, cmd: Command) -> Command:
    topic, queue_id = _queue(cmd)
    return cmd.response(Resp.SUCCESS, None,
                        {"offset": str(broker.store.min_offset(topic, queue_id))})


def handle_earliest_time(broker, conn, cmd: Command) -> Command:
    topic, queue_id = _queue(cmd)
    when = broker.store.earliest_message_time(topic, queue_id)
    return cmd.response(Resp.SUCCESS, None, {"timestamp": str(when)})


def handle_view_by_id(broker, conn, cmd: Command) -> Command:
    offset = Fields(cmd.ext).int64("offset")
    msg = broker.store.message_at(offset) if offset >= 0 else None
    if msg is None:
        raise RemotingError(Resp.SYSTEM_ERROR,
                            f"can not find message by the offset, {offset}")
    return cmd.response(Resp.SUCCESS, None, None, msg.raw)


def _query(store, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool):
    if unique:
        msg = store.query_by_unique_key(topic, key)
        return [msg] if msg is not None else []
    return store.query_by_key(topic, key, max_num, begin, end)


async def _query_message(broker, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    topic, key = f.text("topic"), f.text("key")
    max_num = max(0, min(f.int32("maxNum"), MAX_QUERY_MESSAGES))
    begin, end = f.int64("beginTimestamp"), f.int64("endTimestamp")
    unique = f.boolean("_UNIQUE_KEY_QUERY")
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(broker.slow_pool, _query, broker.store, topic, key,
                                       max_num, begin, end, unique)
    if not found:
        return cmd.response(Resp.QUERY_NOT_FOUND,
                            "can not find message, maybe time range not correct")
    newest = max(found, key=lambda m: m.phys_offset)
    ext = {"indexLastUpdateTimestamp": str(newest.store_timestamp),
           "indexLastUpdatePhyoffset": str(newest.phys_offset)}
    return cmd.response(Resp.SUCCESS, None, ext, b"".join(m.raw for m in found))


def handle_query_message(broker, conn, cmd: Command):
    Fields(cmd.ext).text("key")  # a missing field is refused before going to a thread
    return _query_message(broker, cmd)


def handlers(broker) -> dict:
    return {Req.SEARCH_OFFSET_BY_TIMESTAMP: handle_search_by_time,
            Req.GET_MAX_OFFSET: handle_max_offset, Req.GET_MIN_OFFSET: handle_min_offset,
            Req.GET_EARLIEST_MSG_STORETIME: handle_earliest_time,
            Req.VIEW_MESSAGE_BY_ID: handle_view_by_id, Req.QUERY_MESSAGE: handle_query_message}


__all__ = ["handlers"]
