"""Stores for tests: opened with small defaults and closed for the test, filled with messages.

``open_store`` opens a directory with ``load_config(overrides=...)``; ``StoreFactory`` opens
stores over test defaults (``suite_defaults``: 1 MiB segments, Java's string hash so RocketMQ's
vectors apply, a fixed store host, small index files, no entry points) and closes every one it
opened. ``fill`` puts numbered or seeded random messages, checks every answer, and waits until
they are dispatched.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Iterable, Mapping, Sequence

from mqstore.config import StoreConfig, load_config
from mqstore.message import Message, PutStatus
from mqstore.store import MessageStore
from mqstore.testing.faults import Ack

STORE_HOST = "127.0.0.1:10911"
_FACTORY = object()  # an argument not given: the factory's own


def merged(*layers: Mapping | None) -> dict:
    """Config overrides, later layers winning key by key, at every depth."""
    out: dict = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = merged(value) if isinstance(value, Mapping) else value
    return out


def suite_defaults(*, loops: str = "process", hash_kind: str = "java") -> dict:
    """The test suite's defaults: 1 MiB segments, ``hash_kind`` and a fixed store host (so
    RocketMQ's vectors apply), 24 GiB of "physical memory" (pulls count as in memory), small
    index files, no entry-point plugins, and the loops as ``loops`` (worker ``process``es,
    as the default configuration runs them, or ``thread``s of this process)."""
    return {
        "commit_log": {"segment_bytes": 1 << 20},
        "store": {"hash": hash_kind, "store_host": STORE_HOST},
        "get": {"physical_memory_bytes": 24 << 30},
        "plugins": {"load_entry_points": False},
        "index": {"max_hash_slots": 4096, "max_index_entries": 16384},
        "dispatch": {"worker": loops},
        "flush": {"worker": loops},
    }


def open_store(root: str | os.PathLike, overrides: Mapping | None = None, *,
               read_only: bool = False, clock=None, scheduler=None) -> MessageStore:
    """``MessageStore.open(root)`` with the defaults and ``overrides`` merged over them."""
    return MessageStore.open(root, config=load_config(overrides=overrides), read_only=read_only,
                             clock=clock, scheduler=scheduler)


class StoreFactory:
    """Opens stores for one test and closes all of them at the end (``close_all``, or leave
    a ``with`` block).

    ``factory(overrides=None, *, root=None, read_only=False, clock=..., scheduler=...)``
    opens ``root`` (default: the factory's) with ``overrides`` merged over the factory's
    ``defaults`` (default: ``suite_defaults()``); ``clock`` and ``scheduler``, when not
    given, are the factory's (None: the system's).
    """

    def __init__(self, root: str | os.PathLike | None = None, *, defaults: Mapping | None = None,
                 clock=None, scheduler=None) -> None:
        self.root = root
        self.defaults = suite_defaults() if defaults is None else dict(defaults)
        self.clock = clock
        self.scheduler = scheduler
        self.opened: list[MessageStore] = []

    def config(self, overrides: Mapping | None = None) -> StoreConfig:
        return load_config(overrides=merged(self.defaults, overrides))

    def __call__(self, overrides: Mapping | None = None, *, root=None, read_only: bool = False,
                 clock=_FACTORY, scheduler=_FACTORY) -> MessageStore:
        where = root if root is not None else self.root
        if where is None:
            raise ValueError("root is None and the factory has no root of its own: say where "
                             "the store lives")
        store = MessageStore.open(where, config=self.config(overrides), read_only=read_only,
                                  clock=self.clock if clock is _FACTORY else clock,
                                  scheduler=self.scheduler if scheduler is _FACTORY else scheduler)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        """Close every store opened here (closing a closed one does nothing), newest last."""
        for store in self.opened:
            store.close()

    def __enter__(self) -> "StoreFactory":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()


Tags = str | Sequence[str | None] | Callable[[int], str | None] | None


def numbered(i: int) -> bytes:
    """``fill``'s body of message ``i``."""
    return b"m%04d" % i


def fill(store: MessageStore, count: int | None = None, *, segments: int | None = None,
         topic: str = "T", queues: int = 1, body: bytes | Callable[[int], bytes] = numbered,
         size: int = 0, tags: Tags = None, keys: bool = False, rng: random.Random | None = None, sizes: Sequence[int] = (),
         fields: Callable[[int], dict] | None = None, batch: int = 0,
         acks: list[Ack] | None = None, wait: bool = True) -> list[Ack]:
    """Put ``count`` messages to ``topic``, or as many as it takes for the commit log to have
    ``segments`` segments; each answer must be PUT_OK. Returns an ``Ack`` per message (index,
    queue id, queue offset, commit-log offset), appended to ``acks`` when given, whose length
    is then the first index. ``wait``: until dispatch covers them.

    Message ``i`` goes to queue ``i % queues`` with body ``body(i)`` (``numbered``: ``m0007``),
    or ``body`` itself, padded with ``x`` to ``size`` bytes; tags ``tags`` (one tag, or
    ``tags[i % len(tags)]``, or ``tags(i)``); keys ``[f"k{i}"]`` when ``keys``; and the
    further ``Message`` fields ``fields(i)`` returns. With ``rng`` the draws replace the
    pattern, in this order: a body of random bytes, ``rng.choice(sizes)`` long; the queue; a
    tag from ``tags``; keys or none. ``fields`` may draw more from the same ``rng``. ``batch``:
    that many messages a ``put_batch``, else one ``put`` each.
    """
    if (count is None) == (segments is None):
        raise ValueError(f"count {count!r} and segments {segments!r}: give exactly one")
    if rng is not None and not sizes:
        raise ValueError("rng draws each body's size from sizes: give the sizes to draw from")
    acks = [] if acks is None else acks
    first = len(acks)
    pending: list[tuple[int, Message]] = []

    def more() -> bool:
        if count is not None:
            return len(acks) + len(pending) - first < count
        return len(store.internals.commit_log.segments.segments) < segments

    while more():
        i = len(acks) + len(pending)
        pending.append((i, _message(i, topic, queues, body, size, tags, keys, rng, sizes,
                                    fields)))
        if len(pending) >= max(1, batch) or not more():
            acks.extend(_put(store, pending, batch))
            pending = []
    if wait:
        store.wait_dispatched()
    return acks[first:]


def _message(i, topic, queues, body, size, tags, keys, rng, sizes, fields) -> Message:
    if rng is not None:
        data = rng.randbytes(rng.choice(sizes))
        queue_id = rng.randrange(queues)
        tag = rng.choice(tags) if tags else None
        key = rng.choice([None, [f"k{i}"]]) if keys else None
    else:
        data = body(i) if callable(body) else body
        data += b"x" * (size - len(data))
        queue_id = i % queues
        tag = _pick(tags, i)
        key = [f"k{i}"] if keys else None
    return Message(topic, data, queue_id=queue_id, tags=tag, keys=key,
                   **(fields(i) if fields is not None else {}))


def _pick(tags, i: int) -> str | None:
    if tags is None or isinstance(tags, str):
        return tags
    if callable(tags):
        return tags(i)
    return tags[i % len(tags)]


def _put(store: MessageStore, pending: Iterable[tuple[int, Message]], batch: int) -> list[Ack]:
    pending = list(pending)
    if not batch:
        out = []
        for i, msg in pending:
            r = store.put(msg)
            assert r.status is PutStatus.PUT_OK, f"message {i}: {r.status.name} {r.error}"
            out.append(Ack(i, r.queue_id, r.queue_offset, r.phys_offset))
        return out
    res = store.put_batch([msg for _i, msg in pending])
    assert res.status is PutStatus.PUT_OK, \
        f"messages {pending[0][0]}-{pending[-1][0]}: {res.status.name} {res.error}"
    return [Ack(i, q, o, p) for (i, _m), q, o, p in zip(
        pending, res.queue_ids.tolist(), res.queue_offsets.tolist(), res.phys_offsets.tolist())]
