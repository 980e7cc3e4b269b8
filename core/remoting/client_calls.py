"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), LOCK_BATCH_MQ
(41), UNLOCK_BATCH_MQ (42): ``ClientManageProcessor`` and the lock half of
``AdminBrokerProcessor``, over ``clients.Clients`` and ``locks.QueueLocks``.

A heartbeat records the client's groups and creates each consumer group's ``%RETRY%`` topic
(on a master), and a change of a group's members is told to the members left with a oneway
NOTIFY_CONSUMER_IDS_CHANGED (40) before the heartbeat is answered, as the broker does.
"""

from __future__ import annotations

import itertools
import logging

from mqstore.format import remoting_json
from mqstore.format.remoting_frame import ONEWAY_FLAG, Command
from mqstore.remoting.codes import RemotingError, Req, Resp
from mqstore.remoting.fields import Fields
from mqstore.remoting.topics import RETRY_PREFIX

log = logging.getLogger(__name__)
_opaques = itertools.count(1)  # the broker's own requests


def body_doc(cmd: Command, what: str):
    if not cmd.body:
        raise RemotingError(Resp.SYSTEM_ERROR, f"{what} has no body")
    try:
        return remoting_json.loads(cmd.body)
    except ValueError as exc:
        raise RemotingError(Resp.SYSTEM_ERROR, f"{what} body does not parse: {exc}") from None


def notify_changed(broker, groups: list[str]) -> None:
    """Tell every member of ``groups`` that its group changed (oneway 40)."""
    for name in groups:
        group = broker.clients.group(name)
        if group is None:
            continue
        for member in group.members.values():
            member.connection.send(Command(Req.NOTIFY_CONSUMER_IDS_CHANGED,
                                           opaque=next(_opaques) & 0x7FFFFFFF,
                                           flag=ONEWAY_FLAG, ext={"consumerGroup": name}))


def handle_heartbeat(broker, conn, cmd: Command) -> Command:
    doc = body_doc(cmd, "heartbeat")
    changed = broker.clients.heartbeat(conn, doc, cmd.language, cmd.version)
    if not broker.slave:
        for data in doc.get("consumerDataSet") or []:
            _route, created = broker.topics.ensure(RETRY_PREFIX + data["groupName"], 1, 6)
            if created:
                broker.topic_changed(oneway=True)
    notify_changed(broker, changed)
    return cmd.response(Resp.SUCCESS)


def handle_unregister(broker, conn, cmd: Command) -> Command:
    f = Fields(cmd.ext)
    client_id = f.text("clientID")
    changed = broker.clients.unregister(client_id, f.text("producerGroup", required=False),
                                        f.text("consumerGroup", required=False))
    notify_changed(broker, changed)
    return cmd.response(Resp.SUCCESS)


def handle_consumer_list(broker, conn, cmd: Command) -> Command:
    group = Fields(cmd.ext).text("consumerGroup")
    ids = broker.clients.member_ids(group)
    if not ids:
        return cmd.response(Resp.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return cmd.response(Resp.SUCCESS, None, None,
                        remoting_json.dumps({"consumerIdList": ids}).encode())


def _lock_body(cmd: Command) -> tuple[str, str, list[tuple]]:
    doc = body_doc(cmd, "lock request")
    group, client = doc.get("consumerGroup"), doc.get("clientId")
    mqs = doc.get("mqSet")
    if not isinstance(group, str) or not isinstance(client, str) or not isinstance(mqs, list):
        raise RemotingError(Resp.SYSTEM_ERROR,
                            "lock request body needs consumerGroup, clientId and mqSet")
    out = []
    for mq in mqs:
        if not isinstance(mq, dict):
            raise RemotingError(Resp.SYSTEM_ERROR, f"mqSet entry {mq!r} is not an object")
        out.append((str(mq.get("brokerName")), mq.get("queueId"), str(mq.get("topic"))))
    return group, client, out


def mq_doc(mq: tuple) -> dict:
    return {"brokerName": mq[0], "queueId": mq[1], "topic": mq[2]}


def handle_lock(broker, conn, cmd: Command) -> Command:
    group, client, mqs = _lock_body(cmd)
    got = broker.locks.lock(group, client, mqs)
    body = remoting_json.dumps({"lockOKMQSet": [mq_doc(mq) for mq in got]}).encode()
    return cmd.response(Resp.SUCCESS, None, None, body)


def handle_unlock(broker, conn, cmd: Command) -> Command:
    group, client, mqs = _lock_body(cmd)
    broker.locks.unlock(group, client, mqs)
    return cmd.response(Resp.SUCCESS)


def handlers(broker) -> dict:
    return {Req.HEART_BEAT: handle_heartbeat, Req.UNREGISTER_CLIENT: handle_unregister,
            Req.GET_CONSUMER_LIST_BY_GROUP: handle_consumer_list,
            Req.LOCK_BATCH_MQ: handle_lock, Req.UNLOCK_BATCH_MQ: handle_unlock}


__all__ = ["handlers", "notify_changed"]
