"""Stored messages as plain dicts (for JSON and tables), every field as stored."""

from __future__ import annotations

import base64
import datetime as dt

from mqstore.hashing import crc32
from mqstore.message import StoredMessage


def body_text(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def ms_to_iso(ms: int) -> str:
    """Epoch milliseconds as local ISO-8601 time (what operators read); '' for none."""
    if ms <= 0:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds")


def message_dict(m: StoredMessage) -> dict:
    body = m.body
    return {
        "phys_offset": m.phys_offset, "size": m.size, "topic": m.topic,
        "queue_id": m.queue_id, "queue_offset": m.queue_offset, "msg_id": m.msg_id,
        "tags": m.tags, "keys": m.keys, "uniq_key": m.uniq_key, "properties": m.properties,
        "flag": m.flag, "sysflag": m.sysflag, "body_crc": m.body_crc,
        "crc_ok": crc32(body) == m.body_crc,
        "born_timestamp": m.born_timestamp, "store_timestamp": m.store_timestamp,
        "born_host": m.born_host, "store_host": m.store_host,
        "reconsume_times": m.reconsume_times, "body": body_text(body),
        "body_base64": base64.b64encode(body).decode("ascii"),
    }


def preview(text: str | None, limit: int = 40) -> str:
    if text is None:
        return "(binary)"
    return text if len(text) <= limit else text[:limit - 1] + "…"
