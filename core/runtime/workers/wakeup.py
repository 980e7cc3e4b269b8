"""Dispatch notifications for long polling: a sequence word in a shared file, and a futex on it.

NOTE [ Long polling ]
``<root>/consumer/wakeup`` is a small file that every process of a store maps shared:

    +----------------+----------------------------------------+
    | sequence  u32  | unused (zeros), up to WAKEUP_FILE_BYTES  |
    +----------------+----------------------------------------+
    total = 4 + 4092 = 4096 bytes (one page)

The dispatch loop advances the sequence after each batch it made visible (the dispatch worker
once it has published ``dispatch.dispatched``; a dispatch thread once the units are written),
then wakes every process sleeping on the word (``FUTEX_WAKE``). A consumer reads the word, looks
for messages, and when it found none sleeps in ``FUTEX_WAIT`` until the word differs from what
it read or its timeout passes: a batch published between its look and its sleep has already
changed the word, so the sleep returns at once and nothing is missed. The futex is keyed by the
file's page, so a waiter in any process is woken, read-only stores included, and it outlives a
writer's restart (the file stays; the next writer maps the same page). Anyone may also wake the
waiters without advancing the word (``wake_all``: a consumer joining or leaving its group), which
only makes them look again.

Only the dispatch loop advances the word (one writer, plain aligned stores suffice); the file
holds no state worth keeping and is never flushed. Where futexes are unavailable (not Linux) a
wait sleeps ``FALLBACK_SLICE_S`` at a time instead.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import stat
import sys
import time

from mqstore.errors import CorruptStateError

log = logging.getLogger(__name__)

WAKEUP_DIR = "consumer"
WAKEUP_FILE = "wakeup"
WAKEUP_FILE_BYTES = 4096
FALLBACK_SLICE_S = 0.001
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_EVERYONE = 0x7FFFFFFF
# The futex system call's number on the architectures Linux runs Python on.
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98,
              "loongarch64": 98, "i386": 240, "i686": 240, "armv7l": 240, "armv6l": 240,
              "ppc64le": 221, "ppc64": 221, "s390x": 238}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_call():
    """libc's ``syscall`` bound to futex's number, or None where there is no futex."""
    number = _SYS_FUTEX.get(os.uname().machine) if sys.platform.startswith("linux") else None
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # CDLL releases the GIL during the call
        call = libc.syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32]
    return lambda *args: call(number, *args)


_futex = _futex_call()


def wakeup_path(root: str) -> str:
    return os.path.join(root, WAKEUP_DIR, WAKEUP_FILE)


class Wakeup:
    """The store's wakeup word, mapped in this process: created when missing, or with
    ``create=False`` only opened (``FileNotFoundError`` while no process has made it whole;
    for waiters that must write nothing under the store)."""

    def __init__(self, root: str, *, create: bool = True) -> None:
        path = wakeup_path(root)
        if create:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | (os.O_CREAT if create else 0), 0o644)
        except IsADirectoryError:
            raise CorruptStateError(f"{path} is a directory, not the wakeup file; it is left "
                                    f"as it is: remove it") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CorruptStateError(f"{path} is not a plain file, not the wakeup file; it "
                                        f"is left as it is: remove it")
            # Several processes may create it at once: growing to the same size is harmless
            # and nobody shrinks it.
            if os.fstat(fd).st_size < WAKEUP_FILE_BYTES:
                if not create:
                    raise FileNotFoundError(f"{path} is being made")
                os.ftruncate(fd, WAKEUP_FILE_BYTES)
            self._mm = mmap.mmap(fd, WAKEUP_FILE_BYTES, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._word = ctypes.c_uint32.from_buffer(self._mm)
        self._address = ctypes.addressof(self._word)

    def sequence(self) -> int:
        """The word now; pass it to ``wait`` after looking for messages."""
        return self._word.value

    def wait(self, seen: int, timeout_s: float) -> bool:
        """Sleep until the word differs from ``seen``, someone wakes the waiters, or
        ``timeout_s`` passes; True unless the timeout passed. A spurious return is possible
        (a signal): callers look again and wait again with what is left of their time."""
        if timeout_s <= 0:
            return self._word.value != seen
        if self._word.value != seen:
            return True
        if _futex is None:
            time.sleep(min(timeout_s, FALLBACK_SLICE_S))
            return self._word.value != seen
        whole = int(timeout_s)
        spec = _Timespec(whole, int((timeout_s - whole) * 1e9))
        if _futex(self._address, _FUTEX_WAIT, seen, ctypes.byref(spec), None, 0) == 0:
            return True
        return ctypes.get_errno() != errno.ETIMEDOUT

    def notify(self) -> None:
        """Advance the word and wake every waiter (the dispatch loop, after a batch)."""
        self._word.value = (self._word.value + 1) & 0xFFFFFFFF
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter without advancing the word: they look again."""
        if _futex is not None:
            _futex(self._address, _FUTEX_WAKE, _WAKE_EVERYONE, None, None, 0)

    def close(self) -> None:
        if self._mm is None:
            return
        del self._word  # the mapping cannot close while ctypes still exports it
        self._mm.close()
        self._mm = None



def open_wakeup(root: str) -> Wakeup | None:
    """The wakeup word for a dispatch loop, or None (logged) when the file cannot be made:
    dispatch must go on without it; consumers then only find messages when their wait ends."""
    try:
        return Wakeup(root)
    except (OSError, CorruptStateError) as exc:
        log.warning("long-polling consumers of %s will not be woken: %s", root, exc)
        return None


__all__ = ["Wakeup", "open_wakeup", "wakeup_path", "WAKEUP_FILE_BYTES"]
