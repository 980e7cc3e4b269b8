"""Stored messages as plain dicts (for JSON and tables), every field as stored."""

from __future__ import annotations

import base64
import datetime as dt
import re

from mqstore.hashing import crc32
from mqstore.message import StoredMessage

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 and C1 controls but tab, newline


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


def shown(text: str | None) -> str | None:
    """``text`` when a terminal may be sent it as it is; None when it holds control characters
    other than tab and newline (an escape sequence would drive the terminal)."""
    return None if text is None or CONTROL.search(text) else text


def preview(text: str | None, limit: int = 40) -> str:
    text = shown(text)
    if text is None:
        return "(binary)"
    return text if len(text) <= limit else text[:limit - 1] + "…"
