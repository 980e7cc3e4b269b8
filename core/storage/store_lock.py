"""One writer per store, however the store's files are removed or replaced under it.

NOTE [ Store lock ]
The writer's claim is an ``flock`` on the store directory itself, not only on a file in it:

    <root>/             flock, exclusive: held by the writer while the store is open (and
                        briefly by a command that deletes or rewrites it, ``exclusive``)
    <root>/commitlog/   flock, shared: held by each worker process until it exits
    <root>/lock         RocketMQ's lock file: fcntl locks on byte 0 (the writer, exclusive)
                        and byte 1 (workers, shared), as before the directory locks existed

A lock on a file guards that file's inode, not its name. Remove or replace ``lock`` while a
writer runs (``rm``, a tool cleaning up "stale" locks, ``mqstore demo --force``) and the next
opener creates a new file there, locks it, and writes beside the first writer: acknowledged
messages are lost and the derived files garbled. A directory that holds files cannot be
unlinked, and renaming it carries the lock along with the files it names, so whoever opens
the store, at any path it has, meets the lock. It is an ``flock`` because fcntl's exclusive
lock needs a descriptor open for writing, which a directory never is. An flock belongs to the
open file description, so the writer undoes it explicitly at close: a child that inherited the
descriptor does not keep the store locked after a clean close.

An opener takes the store directory without waiting: refused, it names the holder (the PID in
``/proc/locks``, and whether ``abort`` names it as the writer). It then waits, up to
``WORKER_EXIT_WAIT_S``, for ``commitlog/`` to be free: a worker of a writer killed alone may
still be finishing a batch, and must not write behind the next writer's back. The workers'
lock is on another directory than the writer's so that the writer's stays exclusive, and so
names the writer alone.

The lock file is still taken, for a RocketMQ broker and for mqstore versions that know only
the file, and it is all that is left on a file system whose directories cannot be flocked (a
warning says so). A writer watches its claims (``intact``): once its directory is no longer the
one at its path, or ``lock`` was removed or replaced, it logs an error, makes sure ``abort`` is
there (through the directory it locked, wherever that is now), and leaves no clean-shutdown
marker at close: someone is changing the store's files under it, and only a full recovery at
the next open can tell what is left.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time

from mqstore.errors import DiskFullError, StoreLockedError
from mqstore.storage.file_locks import is_file_at
from mqstore.storage.abort_file import ABORT_FILE

log = logging.getLogger(__name__)
LOCK_FILE = "lock"  # an exclusive OS lock on byte range [0, 1) while open for writing
WORKER_EXIT_WAIT_S = 10.0
WORKERS_DIR = "commitlog"  # the directory the workers' lock is on
PROC_LOCKS = "/proc/locks"
_RETRY_S = 0.01
_UNSUPPORTED = (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)

# flock conflicts between descriptors of one process too, but fcntl locks (the lock file's)
# belong to the process; this table refuses a second writable open in this process clearly.
_HELD: set[tuple[int, int]] = set()
_HELD_GUARD = threading.Lock()


class StoreLock:
    """The writer's lock on store directory ``root`` (NOTE [ Store lock ])."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, LOCK_FILE)
        self._dir_fd = -1
        self._file_fd = -1
        self._key: tuple[int, int] | None = None

    def acquire(self) -> None:
        with _HELD_GUARD:
            dir_fd = _open_dir(self.root)
            try:
                key = _identity(dir_fd)
                if key in _HELD:
                    raise StoreLockedError(f"store {self.root!r} is already open for writing "
                                           f"in this process")
                locked = _lock_directory(dir_fd, self.root)
                if locked and not is_file_at(dir_fd, self.root):
                    raise StoreLockedError(f"store {self.root!r} was moved or replaced while "
                                           f"it was being opened")
                file_fd = _take_file(self.path)
                try:
                    _make_workers_dir(self.root, dir_fd)
                    _wait_for_workers(self.root)
                except BaseException:
                    os.close(file_fd)
                    raise
            except BaseException:
                os.close(dir_fd)  # and with it the directory's lock
                raise
            if not locked:
                os.close(dir_fd)
                dir_fd = -1
            self._dir_fd, self._file_fd, self._key = dir_fd, file_fd, key
            _HELD.add(key)

    def intact(self) -> str | None:
        """What changed under the writer (NOTE [ Store lock ]), or None."""
        if self._key is None:
            return None
        if self._dir_fd >= 0 and not is_file_at(self._dir_fd, self.root):
            return (f"{self.root} is no longer the store directory this writer locked (it was "
                    f"moved, removed or replaced)")
        if self._file_fd >= 0 and not is_file_at(self._file_fd, self.path):
            return f"the store's lock file {self.path} was removed or replaced"
        return None

    def mark_unclean(self) -> None:
        """Make sure ``abort`` is in the locked directory, wherever it is now."""
        if self._dir_fd < 0:
            return
        try:
            fd = os.open(ABORT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644,
                         dir_fd=self._dir_fd)
            try:
                os.write(fd, str(os.getpid()).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("store %s: cannot leave the abort marker (%s); the next open may not "
                      "recover the store in full", self.root, exc)

    def release(self) -> None:
        with _HELD_GUARD:
            if self._file_fd >= 0:
                fcntl.lockf(self._file_fd, fcntl.LOCK_UN, 1, 0)
                os.close(self._file_fd)
                self._file_fd = -1
            if self._dir_fd >= 0:
                fcntl.flock(self._dir_fd, fcntl.LOCK_UN)  # for every descriptor sharing it
                os.close(self._dir_fd)
                self._dir_fd = -1
            if self._key is not None:
                _HELD.discard(self._key)
                self._key = None


def _lock_directory(dir_fd: int, root: str) -> bool:
    """The store directory, exclusively, or StoreLockedError naming the holder (False: this
    file system cannot flock directories)."""
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        raise StoreLockedError(f"store {root!r} is {_holder_text(root, dir_fd)}; open it with "
                               f"read_only=True to read") from None
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        log.warning("store %s: this file system cannot lock directories (%s); the lock file "
                    "alone keeps a second writer out, and removing it lets one in", root,
                    os.strerror(exc.errno))
        return False


def _take_file(path: str) -> int:
    """``lock``, locked on byte 0, once workers of an earlier writer released byte 1."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            raise StoreLockedError(
                f"store {os.path.dirname(path)!r} is open for writing by another process (lock "
                f"file {path} is held); open it with read_only=True to read") from None
        if not is_file_at(fd, path):
            raise StoreLockedError(f"the lock file {path} was removed or replaced while the "
                                   f"store was being opened")
        deadline = time.monotonic() + WORKER_EXIT_WAIT_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise StoreLockedError(
                        f"a worker of an earlier process still runs on store "
                        f"{os.path.dirname(path)!r} (lock byte 1 of {path} is held)") from None
                time.sleep(_RETRY_S)
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 1)
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, b"lock", 0)
        except OSError:  # a full disk: the lock is the OS lock, not this word
            pass
        return fd
    except BaseException:
        os.close(fd)
        raise


def _make_workers_dir(root: str, dir_fd: int) -> None:
    """``commitlog/``, made now if missing (and its entry forced), so that the workers this
    writer starts have it to lock."""
    path = os.path.join(root, WORKERS_DIR)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space to create {path}: {os.strerror(exc.errno)}") from None
        raise
    os.fsync(dir_fd)


def _wait_for_workers(root: str) -> None:
    """Until no worker of an earlier writer holds ``commitlog/`` (WORKER_EXIT_WAIT_S)."""
    try:
        fd = _open_dir(os.path.join(root, WORKERS_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return  # no commit log yet: no worker ever ran
    try:
        deadline = time.monotonic() + WORKER_EXIT_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreLockedError(
                        f"a worker of a writer that is gone still runs on store {root!r} "
                        f"({_pids(fd)} {os.path.join(root, WORKERS_DIR)} after "
                        f"{WORKER_EXIT_WAIT_S:.0f} s)") from None
                time.sleep(_RETRY_S)
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                return  # the lock file's byte 1 waited for them
    finally:
        os.close(fd)  # and with it the lock: the workers about to start take it shared


def hold_worker_lock(root: str) -> tuple[int, ...]:
    """A worker's claim on the store, held until it exits: ``commitlog/`` shared (where the
    file system can lock it) and byte 1 of ``lock`` shared. A new writer waits for both."""
    fds = []
    try:
        dir_fd = _open_dir(os.path.join(root, WORKERS_DIR))
        fds.append(dir_fd)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(f"store {root!r} is being opened by another writer: a "
                                   f"worker of a writer that is gone does not start") from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        fds.append(fd)
        fcntl.lockf(fd, fcntl.LOCK_SH, 1, 1)
    except BaseException:
        release_worker_lock(fds)
        raise
    return tuple(fds)


def release_worker_lock(fds) -> None:
    for fd in fds:
        os.close(fd)


@contextlib.contextmanager
def exclusive(root: str, doing: str):
    """Hold store directory ``root`` exclusively while ``doing`` (a command that deletes or
    rewrites the store) runs; StoreLockedError naming the holder, at once, when a writer, a
    worker or another command holds it. A missing directory needs no guard."""
    with contextlib.ExitStack() as held:
        try:
            dir_fd = _open_dir(root)
        except (FileNotFoundError, NotADirectoryError):
            yield
            return
        held.callback(os.close, dir_fd)  # and with it the lock
        why = _try_exclusive(root, dir_fd)
        if why is None:
            why = _try_workers(root, held)
        if why is not None:
            raise StoreLockedError(f"{doing}: store {root!r} is {why}; nothing was changed")
        yield


def holder(root: str) -> str | None:
    """Who holds store directory ``root`` now (a writer, a worker, a command), or None."""
    with contextlib.ExitStack() as held:
        try:
            dir_fd = _open_dir(root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        held.callback(os.close, dir_fd)
        return _try_exclusive(root, dir_fd) or _try_workers(root, held)


def _try_exclusive(root: str, dir_fd: int) -> str | None:
    """Lock ``dir_fd`` exclusively (None), or say who holds it."""
    if _identity(dir_fd) in _HELD:
        return "open for writing in this process"
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_text(root, dir_fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        return _file_holder(root)
    return None


def _try_workers(root: str, held: contextlib.ExitStack) -> str | None:
    """``commitlog/`` locked exclusively until ``held`` closes (None), or who holds it."""
    try:
        fd = _open_dir(os.path.join(root, WORKERS_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return None
    held.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"still written by a worker of a writer that is gone ({_pids(fd)} commitlog/)"
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    return None


def _file_holder(root: str) -> str | None:
    """Without directory locks: a held ``lock`` file (byte 0) means a live writer."""
    path = os.path.join(root, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return f"open for writing by another process (lock file {path} is held)"
    finally:
        os.close(fd)  # a probe: a lock granted here goes with the descriptor
    return None


def _holder_text(root: str, dir_fd: int) -> str:
    """Who holds the store directory: the writer ``abort`` names, else the PIDs that hold it."""
    holders = _flock_holders(dir_fd)
    writer = _writer_pid(root)
    if writer is not None and (holders is None or writer in holders):
        return f"open for writing by another process (pid {writer})"
    if holders:
        return (f"held by process {', '.join(map(str, holders))} (a writer whose abort file is "
                f"gone, or a command changing the store)")
    return "held by another process (a writer, or a command changing the store)"


def _pids(fd: int) -> str:
    holders = _flock_holders(fd)
    return f"process {', '.join(map(str, holders))} holds" if holders else "someone holds"


def _writer_pid(root: str) -> int | None:
    """The PID ``abort`` names when that process is alive (and not this one)."""
    try:
        with open(os.path.join(root, ABORT_FILE), encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) == os.getpid():
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # someone else's live process
        pass
    return pid


def _flock_holders(fd: int) -> list[int] | None:
    """PIDs holding an flock on ``fd``'s file, other than this process (``/proc/locks``);
    None where that table cannot be read."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    pids = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where \
                and fields[4].isdigit() and int(fields[4]) != os.getpid():
            pids.add(int(fields[4]))  # a waiter's line reads "->" where FLOCK is
    return sorted(pids)


def _open_dir(root: str) -> int:
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
