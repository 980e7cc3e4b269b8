"""Deliveries the endpoint keeps invisible for push consumers while they consume them.

NOTE [ Auto-renewed deliveries ]
A PushConsumer receives with ``auto_renew`` and no invisible duration: it hands the messages
to its listener whenever a consumption thread is free, and never renews a delivery itself.
As RocketMQ 5's proxy (its receipt-handle manager), the endpoint then:

  - pops with ``server.grpc_push_invisible_ms`` (the proxy's defaultInvisibleTimeMills, 60 s),
    and, once the answer was written to the client, holds each delivery under the client's
    id and the message its handle names (group, topic, queue, offset; a message id need not
    be unique); a receive whose answer never reached its client holds nothing: its messages
    come back at their invisible time;
  - every ``period_s`` renews each held delivery whose invisible time ends within
    ``ahead_ms`` by another ``grpc_push_invisible_ms`` (the store gives it a new handle);
  - on an ack or a change of invisible duration naming a held delivery (by the handle the
    client was given, or the latest), presents the latest handle to the store and stops
    holding it;
  - stops renewing a delivery held ``MAX_HOLD_MS`` (the proxy's renewMaxTimeMillis, 3 h): it
    comes back after the group's next retry delay, as a failed consumption would;
  - gives back every delivery of a client that said goodbye (NotifyClientTermination) or
    was forgotten as idle, visible again ``GIVE_BACK_MS`` later (the proxy's
    invisibleTimeMillisWhenClear).

A client holds at most ``MAX_HELD_PER_CLIENT`` deliveries (the Python client caches at most
1024 messages; the Java client 1024 per queue by default) and all clients together at most
``MAX_HELD`` (about 200 bytes each): a receive beyond either is refused TOO_MANY_REQUESTS
until some are acknowledged.

Held deliveries live in the endpoint's memory only: after a restart the client's acks present
handles the store may have renewed since, which it refuses as stale (INVALID_RECEIPT_HANDLE;
the client drops them), and those messages come back at their invisible time. A stopping
endpoint gives nothing back (the proxy does): a delivery not renewed since it was handed out
keeps its handle, so the client's ack after a restart still lands.

Only the event loop's thread calls this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mqstore.consumer.errors import ReceiptHandleError
from mqstore.consumer.receipt_handles import parse_handle
from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

log = logging.getLogger(__name__)

MAX_HELD_PER_CLIENT = 8192
MAX_HELD = 262_144
MAX_HOLD_MS = 3 * 3600 * 1000
GIVE_BACK_MS = 1000
RENEW_AHEAD_MAX_MS = 10_000  # the proxy's renewAheadTimeMillis


@dataclass
class Held:
    given: str  # the handle the client was given
    handle: str  # the delivery's latest handle
    visible_at: int  # store clock ms its invisible time ends
    received_at: int
    attempt: int


Key = tuple  # (group, topic, queue id, queue offset)


def _key(handle: str) -> Key | None:
    try:
        topic, group, queue_id, offset = parse_handle(handle)[:4]
    except ReceiptHandleError:
        return None
    return group, topic, queue_id, offset


class Renewals:
    """``store``: the store (its clock, ``change_invisible_duration``); ``invisible_ms``:
    ``server.grpc_push_invisible_ms``; ``retry_delays_ms``: the group's retry delays by
    attempt (store.message_delay_levels)."""

    def __init__(self, store, invisible_ms: int, retry_delays_ms: list[int]) -> None:
        self._store = store
        self.invisible_ms = invisible_ms
        self.ahead_ms = min(RENEW_AHEAD_MAX_MS, invisible_ms // 2)
        self.period_s = max(0.1, self.ahead_ms / 2000.0)
        self._retry_delays_ms = retry_delays_ms or [GIVE_BACK_MS]
        self._clients: dict[str, dict[Key, Held]] = {}
        self._count = 0  # deliveries held, all clients

    def held(self, client_id: str) -> int:
        return len(self._clients.get(client_id, ()))

    def __len__(self) -> int:
        return self._count

    def check_room(self, client_id: str) -> None:
        """TOO_MANY_REQUESTS when the client, or all clients together, hold all they may."""
        held = self.held(client_id)
        if held >= MAX_HELD_PER_CLIENT:
            raise EndpointError(Code.TOO_MANY_REQUESTS, (
                f"client {client_id!r} holds {held} unacknowledged messages, the most this "
                f"endpoint renews for one client; acknowledge some first"))
        if self._count >= MAX_HELD:
            raise EndpointError(Code.TOO_MANY_REQUESTS, (
                f"push consumers hold {self._count} unacknowledged messages, the most this "
                f"endpoint renews; try again later"))

    def hold(self, client_id: str, deliveries: list[tuple[str, int]]) -> None:
        """Hold ``deliveries`` (handle, attempt) just written to the client."""
        now = self._store.clock()
        mine = self._clients.setdefault(client_id, {})
        for handle, attempt in deliveries:
            key = _key(handle)
            if key is not None:
                self._count += key not in mine
                mine[key] = Held(handle, handle, now + self.invisible_ms, now, attempt)

    def take(self, client_id: str, handle: str) -> str:
        """The handle to present for the client's ``handle`` (the delivery's latest, when the
        client holds it), no longer held; ``handle`` itself otherwise."""
        mine = self._clients.get(client_id)
        if not mine:
            return handle
        key = _key(handle)
        held = mine.get(key)
        if held is None or handle not in (held.given, held.handle):
            return handle
        self._drop(client_id, mine, key)
        return held.handle

    def renew_due(self, known) -> int:
        """Renew what is due, give back what clients not ``known(client_id)`` hold; how many
        deliveries were renewed."""
        now = self._store.clock()
        renewed = 0
        for client_id in list(self._clients):
            if not known(client_id):
                self.give_back(client_id)
                continue
            mine = self._clients[client_id]
            for key, held in list(mine.items()):
                if held.visible_at - now > self.ahead_ms:
                    continue
                if now - held.received_at >= MAX_HOLD_MS:
                    self._change(held, self._retry_delay(held.attempt))
                    self._drop(client_id, mine, key)
                elif self._change(held, self.invisible_ms):
                    renewed += 1
                else:
                    self._drop(client_id, mine, key)
        return renewed

    def _drop(self, client_id: str, mine: dict, key: Key) -> None:
        del mine[key]
        self._count -= 1
        if not mine:
            del self._clients[client_id]

    def give_back(self, client_id: str) -> int:
        """Every delivery ``client_id`` holds visible again ``GIVE_BACK_MS`` from now."""
        mine = self._clients.pop(client_id, None) or {}
        self._count -= len(mine)
        for held in mine.values():
            self._change(held, GIVE_BACK_MS)
        if mine:
            log.info("gave back %d deliveries client %s held", len(mine), client_id)
        return len(mine)

    def give_back_all(self) -> None:
        for client_id in list(self._clients):
            self.give_back(client_id)

    def _retry_delay(self, attempt: int) -> int:
        return self._retry_delays_ms[min(max(attempt, 1), len(self._retry_delays_ms)) - 1]

    def _change(self, held: Held, invisible_ms: int) -> bool:
        """Whether the delivery took ``invisible_ms`` more (it is stale when its client acked
        it under another handle or it came back already)."""
        try:
            held.handle = self._store.change_invisible_duration(held.handle, invisible_ms)
        except ReceiptHandleError as exc:
            log.debug("stopped renewing %s: %s", held.handle, exc)
            return False
        held.visible_at = self._store.clock() + invisible_ms
        return True


__all__ = ["Renewals", "MAX_HELD", "MAX_HELD_PER_CLIENT", "MAX_HOLD_MS", "GIVE_BACK_MS"]
