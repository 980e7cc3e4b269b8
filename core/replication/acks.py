"""A master's slaves as its puts see them: who is connected, what each acknowledged, and the
SYNC_MASTER wait (``append.replicas.Replicas``, handed to the Appender).

RocketMQ's rule (``HAService.isSlaveOK``, ``GroupTransferService``): a SYNC_MASTER put that
waits for the store (``WAIT``, default true) answers SLAVE_NOT_AVAILABLE when no slave is
connected or the furthest one is ``store.ha_slave_fallbehind_max`` bytes or more behind the
put's end; otherwise it waits until some slave acknowledged an offset at or past its end,
for at most ``flush.sync_timeout_ms`` (RocketMQ's ``syncFlushTimeout``), and answers
FLUSH_SLAVE_TIMEOUT when that runs out. Either way the records stay stored. An ASYNC_MASTER
put never waits; both kinds wake the connections' senders, so new bytes leave at once.

A slave counts once its first offset report arrived (a connection that never reports, a port
scanner, is no slave); its acknowledgement is its latest report.

``confirmed`` is the master's confirm offset: the end of the furthest put it answered PUT_OK
(-1 until one is), which its status frames tell mqstore slaves, so a slave's promotion can
tell whether it lacks anything a client was promised. ``sync`` follows the role: a promoted
``sync_master`` starts waiting, a store that is not one does not.

Thread-safe: puts call ``complete_put`` from any thread, each connection's reader ``acked``.
"""

from __future__ import annotations

import threading
import time

from mqstore.message import PutStatus


class SlaveAcks:
    def __init__(self, *, sync: bool, timeout_s: float, fallbehind_max: int) -> None:
        self.sync = sync
        self.timeout_s = timeout_s
        self.fallbehind_max = fallbehind_max
        self._cond = threading.Condition()
        self._acks: dict[object, int] = {}  # slave connection -> acknowledged offset
        self._appended = 0  # generation: puts since start, for the senders
        self._senders = 0  # connections waiting for new bytes (puts skip the wake-up without)
        self._stopped = False
        self.confirmed = -1
        self._confirm_lock = threading.Lock()

    # -- the connections' side -----------------------------------------------------------
    def attach(self, slave: object, offset: int) -> None:
        """A slave's first report arrived: it counts from now on."""
        with self._cond:
            self._acks[slave] = offset
            self._cond.notify_all()

    def acked(self, slave: object, offset: int) -> None:
        with self._cond:
            if slave in self._acks:
                self._acks[slave] = offset
                self._cond.notify_all()

    def detach(self, slave: object) -> None:
        with self._cond:
            self._acks.pop(slave, None)

    def wait_appended(self, seen: int, timeout_s: float) -> int:
        """A sender with nothing left to send sleeps here until a put after generation
        ``seen``, the timeout or the stop; returns the generation now."""
        with self._cond:
            if self._appended == seen and not self._stopped:
                self._senders += 1
                try:
                    self._cond.wait(timeout_s)
                finally:
                    self._senders -= 1
            return self._appended

    @property
    def generation(self) -> int:
        return self._appended

    # -- what a put calls (``Replicas``) -------------------------------------------------
    def complete_put(self, end_offset: int, wait: bool, status: PutStatus) -> PutStatus:
        status = self._complete(end_offset, wait, status)
        if status is PutStatus.PUT_OK and end_offset > self.confirmed:
            with self._confirm_lock:
                self.confirmed = max(self.confirmed, end_offset)
        return status

    def _complete(self, end_offset: int, wait: bool, status: PutStatus) -> PutStatus:
        if self._senders:
            with self._cond:
                self._appended += 1
                self._cond.notify_all()
        else:
            self._appended += 1  # racy by design: a sender checks again within its timeout
        if not self.sync or not wait:
            return status
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            furthest = max(self._acks.values(), default=None)
            if furthest is None or end_offset - furthest >= self.fallbehind_max:
                return PutStatus.SLAVE_NOT_AVAILABLE
            while max(self._acks.values(), default=-1) < end_offset:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return PutStatus.FLUSH_SLAVE_TIMEOUT
                self._cond.wait(left)
        return status

    # -- status ------------------------------------------------------------------------------
    def slaves(self) -> dict[object, int]:
        with self._cond:
            return dict(self._acks)

    def stop(self) -> None:
        """The replication stops: waiting puts answer now, and no slave counts any more."""
        with self._cond:
            self._stopped = True
            self._acks.clear()
            self._cond.notify_all()

    def restart(self) -> None:
        with self._cond:
            self._stopped = False


__all__ = ["SlaveAcks"]
