"""``mqstore.json`` as bytes on disk: one JSON object, read whole and replaced atomically.
What it records (the string hash, the store id, ...) is ``lifecycle.store_meta``'s business;
RocketMQ directories have none."""

from __future__ import annotations

import json
import os

from mqstore.errors import StoreCorruptError
from mqstore.storage.durable_file import write_small_file

META_FILE = "mqstore.json"


def read_meta(root: str) -> dict | None:
    """The object ``mqstore.json`` holds; None without the file; StoreCorruptError naming it
    when it does not parse or holds no object."""
    path = os.path.join(root, META_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"cannot read store metadata {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise StoreCorruptError(f"store metadata {path} must hold a JSON object")
    return meta


def write_meta(root: str, meta: dict) -> None:
    write_small_file(os.path.join(root, META_FILE),
                     json.dumps(meta, indent=2, sort_keys=True).encode(), atomic=True)
