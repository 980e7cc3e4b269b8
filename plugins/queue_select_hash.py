"""Key-hash queue selection: messages with the same shard key always land in the same queue.

The key is ``message.shard_key``, else the message's first key. Strings hash with the store's
string hash (mmh3 for new stores, Java's for RocketMQ stores); integers hash as Java's
``Integer``/``Long.hashCode``. Then, as RocketMQ's SelectMessageQueueByHash:
``abs(javaRemainder(hash, n))``.
"""

from __future__ import annotations

from mqstore.plugin_api import hookimpl, java_remainder


def java_int_hash(value: int) -> int:
    if -(1 << 31) <= value < (1 << 31):
        return value
    v = value & 0xFFFFFFFFFFFFFFFF
    h = (v ^ (v >> 32)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class KeyHashSelector:
    def __init__(self, config=None, string_hash=None) -> None:
        self._hash = string_hash

    def key_of(self, message):
        if message.shard_key is not None:
            return message.shard_key
        keys = message.keys
        if isinstance(keys, str):
            keys = keys.split()
        if keys:
            return keys[0]
        raise ValueError(
            f"queue selector 'key_hash' needs a shard_key or keys on the message to topic "
            f"{message.topic!r}; set one or pass queue_id"
        )

    def select(self, message, queue_count: int) -> int:
        key = self.key_of(message)
        h = java_int_hash(key) if isinstance(key, int) else self._hash(str(key))
        return abs(java_remainder(h, queue_count))


@hookimpl(trylast=True)
def register_queue_selectors(registry):
    registry.add("key_hash", KeyHashSelector)
