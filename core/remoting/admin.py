"""What ``mqadmin`` asks a broker (``AdminBrokerProcessor``): UPDATE_AND_CREATE_TOPIC (17),
GET_ALL_TOPIC_CONFIG (21), GET_BROKER_RUNTIME_INFO (28), GET_TOPIC_STATS_INFO (202),
GET_CONSUMER_CONNECTION_LIST (203), GET_CONSUME_STATS (208), QUERY_TOPIC_CONSUME_BY_WHO (300).

Bodies are fastjson's (``format.remoting_json``): 202 and 208 key their offset tables by
message-queue objects, as the broker writes them. Topic changes go through the store's topic
configs (``store.create_topic`` / ``update_topic``, docs/topics.md) and are registered with the
NameServers at once.
"""

from __future__ import annotations

import os
import time

from mqstore.format import remoting_json
from mqstore.format.remoting_json import ObjectKey
from mqstore.format.remoting_frame import Command
from mqstore.remoting.codes import RemotingError, Req, Resp
from mqstore.remoting.fields import Fields
from mqstore.remoting.stats import FOUND, GOT, MISSED, PUTS, java_double

BROKER_VERSION_DESC = "V4_9_8"


def _json(doc) -> bytes:
    return remoting_json.dumps(doc).encode()


def mq_key(broker, topic: str, queue_id: int) -> ObjectKey:
    return ObjectKey.of(brokerName=broker.name, queueId=queue_id, topic=topic)


def handle_update_topic(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    topic = f.text("topic")
    read, write, perm = f.int32("readQueueNums"), f.int32("writeQueueNums"), f.int32("perm")
    if broker.slave:
        raise RemotingError(Resp.SYSTEM_ERROR, f"broker {broker.name} is a slave: create "
                                               f"topics on its master")
    perm &= 6  # the store keeps read and write; inherit and priority are the broker's
    store = broker.store
    try:
        if store.topic_config(topic) is None:
            store.create_topic(topic, read_queues=read, write_queues=write, perm=perm)
        else:
            store.update_topic(topic, read_queues=read, write_queues=write, perm=perm)
    except ValueError as exc:
        raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None
    broker.topic_changed(oneway=False)
    return cmd.response(Resp.SUCCESS, "not set any response code")


def handle_all_topic_config(broker, conn, cmd: Command) -> Command:
    return cmd.response(Resp.SUCCESS, None, None, _json(broker.topics.wrapper_doc()))


def runtime_table(broker) -> dict[str, str]:
    """``BrokerController.getRuntimeInfo`` (what clusterList and brokerStatus print); the
    rates and daily totals as NOTE [ Broker stats ] keeps them."""
    store, stats = broker.store, broker.stats
    counts = store.put_counts()
    now = int(time.time() * 1000)
    return {
        "brokerVersionDesc": BROKER_VERSION_DESC, "brokerVersion": "409",
        "msgPutTotalYesterdayMorning": str(stats.put_yesterday_morning),
        "msgPutTotalTodayMorning": str(stats.put_today_morning),
        "msgPutTotalTodayNow": str(counts.messages),
        "msgGetTotalYesterdayMorning": str(stats.got_yesterday_morning),
        "msgGetTotalTodayMorning": str(stats.got_today_morning),
        "msgGetTotalTodayNow": str(stats.got_messages),
        "putTps": stats.rates(PUTS), "getFoundTps": stats.rates(FOUND),
        "getMissTps": stats.rates(MISSED), "getTransferedTps": stats.rates(GOT),
        "getTotalTps": stats.total_get_rates(),
        "commitLogMinOffset": str(store.min_phys_offset),
        "commitLogMaxOffset": str(store.max_phys_offset),
        "commitLogDiskRatio": java_double(disk_used_ratio(commit_log_dir(store))),
        "dispatchBehindBytes": str(store.dispatch_behind_bytes()),
        "earliestMessageTimeStamp": str(_earliest(store)), "bootTimestamp": str(stats.started_ms),
        "sendThreadPoolQueueHeadWaitTimeMills": "0", "pullThreadPoolQueueHeadWaitTimeMills": "0",
        "runtime": f"[ {(now - stats.started_ms) // 86_400_000} days ]",
        "pageCacheLockTimeMills": str(store.lock_held_ms()),
        "remainHowManyDataToFlush": "0 B", "remainTransientStoreBufferNumbs": "0",
        "sendThreadPoolQueueSize": "0", "sendThreadPoolQueueCapacity": "10000",
        "pullThreadPoolQueueSize": "0", "pullThreadPoolQueueCapacity": "100000",
        "queryThreadPoolQueueSize": "0", "queryThreadPoolQueueCapacity": "20000",
        "brokerName": broker.name, "brokerId": str(broker.broker_id),
        "brokerAddr": broker.address, "clusterName": broker.cluster,
    }


def commit_log_dir(store) -> str:
    path = os.path.join(store.root, "commitlog")
    return path if os.path.isdir(path) else store.root


def disk_used_ratio(path: str) -> float:
    """``UtilAll.getDiskPartitionSpaceUsedPercent``: the file system's used blocks (total
    minus free, root's reserve counted as used by nobody) over used plus what non-root users
    may still take, rounded up to a whole percent; -1.0 when the path cannot be measured."""
    try:
        disk = os.statvfs(path)
    except OSError:
        return -1.0
    if not disk.f_blocks:
        return -1.0
    used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
    entire = used + disk.f_bavail * disk.f_frsize
    if not entire:
        return -1.0
    return -(-used * 100 // entire) / 100.0


def _earliest(store) -> int:
    """The store time of the commit log's first record (clusterList's "#Hour" counts from it)."""
    first = store.min_phys_offset
    try:
        msg = store.message_at(first) if first >= 0 else None
    except ValueError:  # damaged: reported by the store's checks, not here
        return 0
    return msg.store_timestamp if msg is not None else 0


def handle_runtime_info(broker, conn, cmd: Command) -> Command:
    table = dict(sorted(runtime_table(broker).items()))
    return cmd.response(Resp.SUCCESS, None, None, _json({"table": table}))


def _queues(broker, topic: str) -> list[int]:
    route = broker.topics.route(topic)
    if route is None:
        raise RemotingError(Resp.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    return list(range(route.read))


def handle_topic_stats(broker, conn, cmd: Command) -> Command:
    topic = Fields(cmd.ext).text("topic")
    store = broker.store
    table = {}
    for q in _queues(broker, topic):
        low, high = store.min_offset(topic, q), store.max_offset(topic, q)
        last = 0
        if high > 0:
            last = store.earliest_message_time(topic, q) if high - 1 == low else _time_at(
                store, topic, q, high - 1)
        table[mq_key(broker, topic, q)] = {"lastUpdateTimestamp": last, "maxOffset": high,
                                           "minOffset": low}
    return cmd.response(Resp.SUCCESS, None, None, _json({"offsetTable": table}))


def _time_at(store, topic: str, queue_id: int, offset: int) -> int:
    batch = store.read(topic, queue_id, offset, 1)
    if batch is None or not len(batch):
        return 0
    return int(batch.store_timestamps[0])


def handle_consume_stats(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    group, only = f.text("consumerGroup"), f.text("topic", required=False)
    store = broker.store
    topics = set(t for (t, g) in store.consumer_groups() if g == group)
    online = broker.clients.group(group)
    if online is not None:
        topics |= set(online.subscriptions)
    if only:
        topics = {only} & topics
    table = {}
    tps = 0.0
    for topic in sorted(topics):
        route = broker.topics.route(topic)
        if route is None:
            continue
        committed = store.committed_offsets(group, topic)
        tps += broker.stats.group_tps(group, topic)
        for q in range(route.read):
            high = store.max_offset(topic, q)
            done = committed.get(q, 0)
            last = _time_at(store, topic, q, done - 1) if done > 0 else 0
            table[mq_key(broker, topic, q)] = {"brokerOffset": high, "consumerOffset": done,
                                               "lastTimestamp": last}
    return cmd.response(Resp.SUCCESS, None, None,
                        _json({"consumeTps": tps, "offsetTable": table}))


def handle_consumer_connections(broker, conn, cmd: Command) -> Command:
    name = Fields(cmd.ext).text("consumerGroup")
    group = broker.clients.group(name)
    if group is None:
        return cmd.response(Resp.CONSUMER_NOT_ONLINE, "the consumer group not online")
    connections = [{"clientAddr": m.connection.peer, "clientId": m.client_id,
                    "language": m.language, "version": m.version}
                   for m in group.members.values()]
    doc = {"connectionSet": connections, "consumeFromWhere": group.consume_from,
           "consumeType": group.consume_type, "messageModel": group.message_model,
           "subscriptionTable": {t: s.doc() for t, s in group.subscriptions.items()}}
    return cmd.response(Resp.SUCCESS, None, None, _json(doc))


def handle_consume_by_who(broker, conn, cmd: Command) -> Command:
    topic = Fields(cmd.ext).text("topic")
    groups = {g for (t, g) in broker.store.consumer_groups() if t == topic}
    groups |= set(broker.clients.groups_of_topic(topic))
    return cmd.response(Resp.SUCCESS, None, None, _json({"groupList": sorted(groups)}))


def handlers(broker) -> dict:
    return {Req.UPDATE_AND_CREATE_TOPIC: handle_update_topic,
            Req.GET_ALL_TOPIC_CONFIG: handle_all_topic_config,
            Req.GET_BROKER_RUNTIME_INFO: handle_runtime_info,
            Req.GET_TOPIC_STATS_INFO: handle_topic_stats,
            Req.GET_CONSUMER_CONNECTION_LIST: handle_consumer_connections,
            Req.GET_CONSUME_STATS: handle_consume_stats,
            Req.QUERY_TOPIC_CONSUME_BY_WHO: handle_consume_by_who}


__all__ = ["handlers", "runtime_table"]
