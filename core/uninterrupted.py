"""Sections of the main thread that a signal handler cannot split.

NOTE [ Uninterrupted puts ]
Python runs signal handlers in the main thread, between any two bytecodes. A Ctrl-C landing
after a put copied its records into the log and before it advanced the queue-offset table (or
published the new end to the workers) would leave the two disagreeing: the next put would
reuse the same queue offsets. A put is all-or-nothing whatever arrives, so while the main
thread is inside a put's critical section, signals that have a Python handler are recorded
instead of handled, and the original handler runs when the section ends: the
KeyboardInterrupt (or whatever a program's own handler raises) then arrives after the put is
complete and visible. Everything fallible in a put (validation, encoding, reserving segments)
happens before its first byte is written, so inside the section only copies and assignments
remain, and a signal is the only thing that could have split them.

The store wraps the handlers present when it opens (SIGINT's default KeyboardInterrupt and any
handler a program set for SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 or SIGALRM) and restores
them when its last open store closes, unless the program replaced them since. A SIGINT or
SIGTERM handler the program sets after the open (the usual graceful-shutdown handler) is
wrapped at the next put, before its section begins; set the others before opening. Only a
store opened in the main thread can wrap them (Python allows signal.signal nowhere else).
Handlers never run in other threads, so their sections need no deferral.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import select
import signal
from _signal import getsignal as _raw_getsignal
import threading

SHIELDED = tuple(getattr(signal, name) for name in (
    "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name))
LATE = (signal.SIGINT, signal.SIGTERM)  # wrapped again at each put when replaced since open


class _Shield:
    def __init__(self) -> None:
        self.main_ident = threading.main_thread().ident
        self.depth = 0  # main-thread sections entered and not yet left
        self.pending: list[tuple[int, object]] = []
        self.originals: dict[int, object] = {}
        self.users = 0
        self._guard = threading.Lock()
        # One bound method, passed to signal.signal and compared by identity with what
        # getsignal returns (each attribute access would make a new one).
        self.handler = self._handle

    # -- installing ------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the Python-level handlers (one more open store uses them)."""
        if threading.get_ident() != self.main_ident:
            return
        with self._guard:
            self.users += 1
            if self.users > 1:
                return
            for signum in SHIELDED:
                current = signal.getsignal(signum)
                if callable(current) and current is not self.handler:
                    self.originals[signum] = current
                    signal.signal(signum, self.handler)

    def uninstall(self) -> None:
        if threading.get_ident() != self.main_ident:
            return
        with self._guard:
            if self.users == 0:
                return
            self.users -= 1
            if self.users:
                return
            for signum, original in self.originals.items():
                if signal.getsignal(signum) is self.handler:
                    signal.signal(signum, original)
            self.originals.clear()

    def _handle(self, signum, frame) -> None:
        if self.depth:
            self.pending.append((signum, frame))
            return
        self._dispatch(signum, frame)

    def _dispatch(self, signum, frame) -> None:
        original = self.originals.get(signum)
        if original is None:  # the last store closed inside the section: handed back already
            current = signal.getsignal(signum)
            original = current if current is not self.handler else None
        if callable(original):
            original(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    # -- sections --------------------------------------------------------------------------
    def enter(self) -> None:
        if threading.get_ident() == self.main_ident:
            if self.users and not self.depth:
                self._rewrap()
            self.depth += 1

    def _rewrap(self) -> None:
        """Wrap again a Ctrl-C or SIGTERM handler the program set after the store opened
        (a graceful-shutdown handler, typically): it becomes the handler run after the
        section. Two lookups per put; the other signals are wrapped at open only. The lookups
        are the C module's: ``signal.getsignal`` turns each answer into an enum member, which
        cost a put more than the rest of this shield."""
        handle, getsignal = self.handler, _raw_getsignal
        for signum in LATE:
            current = getsignal(signum)
            if current is not handle and callable(current):
                self.originals[signum] = current
                signal.signal(signum, handle)

    def leave(self) -> None:
        """End a section; a signal that arrived inside it is handled now (and may raise)."""
        if threading.get_ident() != self.main_ident:
            return
        self.depth -= 1
        if self.depth == 0 and self.pending:
            pending, self.pending = self.pending, []
            for signum, frame in pending:
                self._dispatch(signum, frame)


shield = _Shield()


# -- worker processes ------------------------------------------------------------------------
# A terminal sends Ctrl-C to its whole foreground process group, and systemd, a container
# runtime or a `kill -- -PGID` send SIGTERM to the whole group: workers included. Workers leave
# both to the store process: it decides whether to close (and stop them in order, so a
# shutdown is a stop, never a worker death to report and restart) or to carry on; a store
# process that dies of the signal instead is noticed by its workers (``parent_alive``), which
# then finish their work and exit. Workers are started with both signals blocked, so that one
# arriving while the child interpreter boots stays pending, and ignore them (dropping anything
# pending) before unblocking them. The forkserver the workers are forked from is started the
# same way and keeps them blocked: it lives until its store process is gone, so a signal to the
# group does not take it down (the exit codes of the workers are read through it, and a
# restart needs it). SIGHUP, a reload of ``mqstore serve`` (or a terminal's hangup), goes the
# same way: the store process decides.

WORKER_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interrupts_blocked():
    """Block SIGINT, SIGTERM and SIGHUP in the calling thread (children started meanwhile
    inherit the mask)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(WORKER_IGNORED))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def worker_signals() -> None:
    """Called first thing in a worker process."""
    for signum in WORKER_IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(WORKER_IGNORED))


_parent_poll: tuple[int, select.poll] | None = None  # (sentinel, poller registered on it)


def parent_alive() -> bool:
    """False once the process that started this worker is gone (its sentinel closed).

    A busy dispatch worker asks this on every pass, up to a thousand times a second: one
    ``poll`` on a poller kept for the sentinel, where ``Process.is_alive`` would build and
    tear down a selector each time."""
    global _parent_poll
    parent = multiprocessing.parent_process()
    if parent is None:
        return True
    sentinel = parent.sentinel
    if _parent_poll is None or _parent_poll[0] != sentinel:
        poller = select.poll()
        poller.register(sentinel, select.POLLIN)
        _parent_poll = (sentinel, poller)
    return not _parent_poll[1].poll(0)  # readable or hung up: the parent's end closed
