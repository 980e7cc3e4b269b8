"""The NameServer's answers for this one broker (``DefaultRequestProcessor``), served on the
broker's own port when no NameServer is configured (``server.namesrv_addr`` unset), so one
``mqstore serve`` is a whole deployment for clients told ``set_namesrv_addr(broker port)``:
GET_ROUTEINFO_BY_TOPIC (105), GET_BROKER_CLUSTER_INFO (106),
GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206).

A route lists this broker (``brokerAddrs`` ``{0: address}``; a slave answers with its own id)
and the topic's queue counts and perm. Its broker-address map is written as fastjson writes it,
with unquoted integer keys (``{0:"127.0.0.1:10911"}``): RocketMQ's C++ client reads only
that form, and a 4.9.8 NameServer sends it to every request whose version field is below 401
that did not ask for standard JSON (``acceptStandardJsonOnly``); the others get ``{"0":...}``. 106 is always
unquoted, as the NameServer writes it. A topic the broker does not have answers
TOPIC_NOT_EXIST, as the NameServer does; producers then ask for ``TBW102``, whose route new
topics inherit (``topics.auto_create``).
"""

from __future__ import annotations

import json

from mqstore.format import remoting_json
from mqstore.format.remoting_frame import Command
from mqstore.remoting.codes import RemotingError, Req, Resp
from mqstore.remoting.fields import Fields

STANDARD_JSON_VERSION = 401  # requests from this version on get standard JSON


def broker_data(broker) -> dict:
    return {"brokerAddrs": {broker.broker_id: broker.address}, "brokerName": broker.name,
            "cluster": broker.cluster}


def route_doc(broker, topic: str) -> dict:
    route = broker.topics.route(topic)
    if route is None:
        raise RemotingError(Resp.TOPIC_NOT_EXIST, (
            f"No topic route info in name server for the topic: {topic}"))
    queue = {"brokerName": broker.name, "perm": route.perm, "readQueueNums": route.read,
             "topicSysFlag": route.sys_flag, "writeQueueNums": route.write}
    return {"brokerDatas": [broker_data(broker)], "filterServerTable": {},
            "queueDatas": [queue]}


def handle_route(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    doc = route_doc(broker, f.text("topic"))
    if cmd.version >= STANDARD_JSON_VERSION or f.boolean("acceptStandardJsonOnly"):
        body = json.dumps(doc, separators=(",", ":")).encode()
    else:
        body = remoting_json.dumps(doc).encode()
    return cmd.response(Resp.SUCCESS, None, None, body)


def handle_cluster_info(broker, conn, cmd: Command) -> Command:
    doc = {"brokerAddrTable": {broker.name: broker_data(broker)},
           "clusterAddrTable": {broker.cluster: [broker.name]}}
    return cmd.response(Resp.SUCCESS, None, None, remoting_json.dumps(doc).encode())


def handle_topic_list(broker, conn, cmd: Command) -> Command:
    doc = {"topicList": sorted(broker.topics.table())}
    return cmd.response(Resp.SUCCESS, None, None, remoting_json.dumps(doc).encode())


def handlers(broker) -> dict:
    if broker.registration is not None:
        return {}  # real NameServers answer these
    return {Req.GET_ROUTEINFO_BY_TOPIC: handle_route,
            Req.GET_BROKER_CLUSTER_INFO: handle_cluster_info,
            Req.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: handle_topic_list}


__all__ = ["handlers", "route_doc"]
