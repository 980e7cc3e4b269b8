"""Messages on the wire (``apache.rocketmq.v2.Message``) <-> the store's messages, field by
field as the Apache proxy converts them.

Sending (``to_store``)::

    topic{namespace, name}        the record's topic (``<namespace>%<name>``)
    body (IDENTITY or GZIP)       the body, stored uncompressed
    system_properties.tag         TAGS
    system_properties.keys        KEYS (joined with spaces; a key holding one arrives as two)
    system_properties.message_id  UNIQ_KEY (the client's id; RocketMQ's message id)
    message_group                 __SHARDINGKEY (a FIFO message)
    trace_context                 TRACE_CONTEXT
    born_timestamp                the record's born timestamp (the Python client sends seconds)
    delivery_timestamp            TIMER_DELIVER_MS (a DELAY message: the store's timers)
    user_properties               the other properties; RocketMQ's own names are refused
    (the connection's peer)       the record's born host

What the store accepts is refused further by the proxy's own rules (``rules``: tags, keys,
message groups, property names and values), with the proxy's codes.

Receiving (``to_wire``) reverses it and adds what the store knows: the store timestamp and
host, the queue and queue offset, the pop's receipt handle and delivery attempt, and the body
digest: MD5, upper-case hex, as the proxy sends it (the Java and Python clients agree on that
format; they disagree on CRC32's). A body stored compressed (a RocketMQ producer's zlib) is
sent uncompressed, so every client reads it whatever compression it knows.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import zlib

from google.protobuf.timestamp_pb2 import Timestamp

from mqstore.endpoint import rules
from mqstore.endpoint.protocol import Code, definition_pb2
from mqstore.endpoint.resources import resource
from mqstore.endpoint.status import EndpointError
from mqstore.format.properties import (
    KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, check_keys, check_property,
    check_tags,
)
from mqstore.format.record import SYSFLAG_COMPRESSED
from mqstore.message import Message

log = logging.getLogger(__name__)
MessageType = definition_pb2.MessageType
Encoding = definition_pb2.Encoding
SHARDING_KEY = "__SHARDINGKEY"
TRACE_CONTEXT = "TRACE_CONTEXT"
BORN_HOST = "__BORNHOST"
TRANSACTION_PREPARED = "TRAN_MSG"
DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC")
# RocketMQ's MessageConst.STRING_HASH_SET: names a client may not set as user properties and
# that a receiver does not see as such; plus the two the endpoint carries as system properties.
SYSTEM_PROPERTY_NAMES = frozenset((
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
    "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
    "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
    "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
    "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
    "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", BORN_HOST, "BORN_TIMESTAMP",
    SHARDING_KEY, TRACE_CONTEXT,
))
STORED_TYPES = frozenset((MessageType.MESSAGE_TYPE_UNSPECIFIED, MessageType.NORMAL,
                          MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION))
PRODUCER_GROUP = "PGROUP"
CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
# The enum values as plain ints: each attribute of a protobuf enum wrapper is a Python-level
# lookup, which every message of every send would pay for again.
_GZIP = Encoding.GZIP
_IDENTITY = Encoding.IDENTITY
_PLAIN_ENCODINGS = frozenset((Encoding.IDENTITY, Encoding.ENCODING_UNSPECIFIED))
_MD5 = definition_pb2.DigestType.MD5
_TRANSACTION, _DELAY, _FIFO, _NORMAL = (MessageType.TRANSACTION, MessageType.DELAY,
                                        MessageType.FIFO, MessageType.NORMAL)
_MS_PER_S, _NS_PER_MS, _NS_PER_S = 1000, 1_000_000, 1_000_000_000
_SECONDS_BEFORE_10000 = 253_402_300_800  # a Timestamp's limit: 0001-01-01 to 9999-12-31
GZIP_WBITS = 16 + zlib.MAX_WBITS


def md5_digest(body: bytes) -> str:
    return hashlib.md5(body).hexdigest().upper()


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(GZIP_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise EndpointError(Code.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: "
                                                    f"{exc}") from None
    if len(out) > limit:
        raise EndpointError(Code.MESSAGE_BODY_TOO_LARGE, f"the GZIP body inflates past "
                                                         f"{limit} bytes "
                                                         f"(commit_log.max_message_bytes)")
    return out


def to_store(msg, topic: str, born_host: str | None, max_body_bytes: int) -> Message:
    """The store message of wire message ``msg``, or EndpointError with the proxy's code."""
    sp = msg.system_properties
    if sp.message_type not in STORED_TYPES:
        kind = MessageType.Name(sp.message_type)
        raise EndpointError(Code.UNSUPPORTED, f"message type {kind} is not supported: mqstore "
                                              f"stores NORMAL, FIFO, DELAY and TRANSACTION "
                                              f"messages (no lite topics or priorities)")
    body = msg.body
    encoding = sp.body_encoding
    if encoding == _GZIP:
        body = _gunzip(body, max_body_bytes)
    elif encoding not in _PLAIN_ENCODINGS:
        raise EndpointError(Code.BAD_REQUEST, f"body encoding {encoding} is not "
                                              f"IDENTITY or GZIP")
    if not body:
        raise EndpointError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(body) > max_body_bytes:
        raise EndpointError(Code.MESSAGE_BODY_TOO_LARGE, (
            f"message body of {len(body)} bytes exceeds {max_body_bytes} bytes "
            f"(commit_log.max_message_bytes)"))
    message_id = sp.message_id
    if not message_id:
        raise EndpointError(Code.ILLEGAL_MESSAGE_ID, "message id is empty")
    user = msg.user_properties
    properties = dict(user) if user else {}
    for name, value in properties.items():
        if name in SYSTEM_PROPERTY_NAMES:
            raise EndpointError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                                f"property {name!r} is used by the system")
        rules.check_user_property(name, value)
        try:
            check_property(name, value)
        except ValueError as exc:
            raise EndpointError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, str(exc)) from None
    try:
        check_property(PROPERTY_UNIQ_KEY, message_id)
    except ValueError as exc:
        raise EndpointError(Code.ILLEGAL_MESSAGE_ID, str(exc)) from None
    properties[PROPERTY_UNIQ_KEY] = message_id
    group = sp.message_group
    if group:
        rules.check_message_group(group)
        properties[SHARDING_KEY] = group
    trace = sp.trace_context
    if trace:
        properties[TRACE_CONTEXT] = trace
    tags = sp.tag or None
    if tags is not None:
        rules.check_tag(tags)
        try:
            check_tags(tags)
        except ValueError as exc:
            raise EndpointError(Code.ILLEGAL_MESSAGE_TAG, str(exc)) from None
    # RocketMQ joins the keys with spaces into KEYS, and a receiver splits them there: a key
    # holding a space arrives as two.
    keys = sp.keys
    if keys:
        rules.check_keys(keys)
    keys = (KEY_SEPARATOR.join(keys).split() or None) if keys else None
    if keys is not None:
        try:
            check_keys(keys)
        except ValueError as exc:
            raise EndpointError(Code.ILLEGAL_MESSAGE_KEY, str(exc)) from None
    born_ms = None
    if sp.HasField("born_timestamp"):
        stamp = sp.born_timestamp
        seconds, nanos = stamp.seconds, stamp.nanos
        if 0 < seconds < _SECONDS_BEFORE_10000 and 0 <= nanos < _NS_PER_S:
            born_ms = seconds * _MS_PER_S + nanos // _NS_PER_MS
        else:  # the rest as protobuf reads it (which refuses what no Timestamp may hold)
            born_ms = stamp.ToMilliseconds()
            if born_ms <= 0:
                born_ms = None
    if sp.message_type == _DELAY:
        properties[TIMER_DELIVER_MS] = str(_delivery_ms(sp))
    elif sp.message_type == _TRANSACTION:  # a half; the topic is its group, as the proxy's
        properties[TRANSACTION_PREPARED] = "true"
        properties[PRODUCER_GROUP] = topic
        if sp.HasField("orphaned_transaction_recovery_duration"):
            properties[CHECK_IMMUNITY_S] = str(
                max(0, sp.orphaned_transaction_recovery_duration.seconds))
    return Message(topic, body, tags=tags, keys=keys, properties=properties,
                   born_timestamp=born_ms, born_host=born_host)


def _delivery_ms(sp) -> int:
    if not sp.HasField("delivery_timestamp"):
        raise EndpointError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs its "
                                                        "delivery_timestamp")
    try:
        return sp.delivery_timestamp.ToMilliseconds()
    except ValueError as exc:
        raise EndpointError(Code.ILLEGAL_DELIVERY_TIME, f"delivery_timestamp: {exc}") from None


def delivery_ms(msg: Message) -> int | None:
    """The delivery time a store message of ``to_store`` asks for, or None."""
    props = msg.properties
    text = props.get(TIMER_DELIVER_MS) if props else None
    return None if text is None else int(text)


def peer_host(peer: str) -> str | None:
    """gRPC's ``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` as the store's ``ip:port``; None for
    anything else (a unix socket)."""
    scheme, _sep, address = peer.partition(":")
    return address if scheme in ("ipv4", "ipv6") and address else None


def java_host(host: str) -> tuple[str, str]:
    """``"ip:port"`` (``"[v6]:port"``) as Java's ``InetAddress.getHostAddress()`` writes the
    address, which is what the proxy sends: IPv6 in eight groups, none compressed."""
    if host.startswith("["):
        address, _sep, port = host[1:].partition("]:")
        groups = ipaddress.IPv6Address(address).exploded.split(":")
        return ":".join(g.lstrip("0") or "0" for g in groups), port
    address, _sep, port = host.rpartition(":")
    return address, port


def message_type(props: dict) -> int:
    if props.get(TRANSACTION_PREPARED) == "true":
        return _TRANSACTION
    if any(name in props for name in DELAY_PROPERTIES):
        return _DELAY
    if SHARDING_KEY in props:
        return _FIFO
    return _NORMAL


def to_wire(popped, receipt_handle: str, delivery_attempt: int) -> definition_pb2.Message:
    """The wire message of a popped message (a ``PoppedMessage``, or any message with a
    ``full`` StoredMessage, ``queue_id`` and ``queue_offset``)."""
    full = popped.full
    props = full.properties
    body = full.body
    if full.sysflag & SYSFLAG_COMPRESSED:
        try:
            body = full.decompressed_body()
        except ValueError as exc:  # damaged: delivered as stored rather than never
            log.warning("delivering the body of %s as stored: %s", full, exc)
    out = definition_pb2.Message(
        topic=resource(full.topic), body=body,
        user_properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES})
    sp = out.system_properties
    tags = props.get(PROPERTY_TAGS)
    if tags:
        sp.tag = tags
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(KEY_SEPARATOR) if k)
    sp.message_id = props.get(PROPERTY_UNIQ_KEY) or full.msg_id
    sp.body_digest.type = _MD5
    sp.body_digest.checksum = md5_digest(body)
    sp.body_encoding = _IDENTITY
    sp.message_type = message_type(props)
    sp.born_timestamp.FromMilliseconds(full.born_timestamp)
    sp.born_host = props.get(BORN_HOST) or java_host(full.born_host)[0]
    sp.store_timestamp.FromMilliseconds(full.store_timestamp)
    sp.store_host = ":".join(java_host(full.store_host))
    sp.receipt_handle = receipt_handle
    sp.queue_id = popped.queue_id
    sp.queue_offset = popped.queue_offset
    sp.delivery_attempt = delivery_attempt
    group = props.get(SHARDING_KEY)
    if group:
        sp.message_group = group
    deliver = props.get(TIMER_DELIVER_MS)
    if deliver is not None and deliver.isdecimal():
        sp.delivery_timestamp.FromMilliseconds(int(deliver))
    trace = props.get(TRACE_CONTEXT)
    if trace:
        sp.trace_context = trace
    return out


def now_timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


__all__ = ["to_store", "to_wire", "peer_host", "md5_digest", "message_type",
           "SYSTEM_PROPERTY_NAMES", "now_timestamp"]
