"""A consumer group's live instances and who consumes which queue, in files and flocks.

NOTE [ Group membership ]
    <root>/consumer/groups/<group>/<topic>/members/<member id>   one per live instance
    <root>/consumer/groups/<group>/<topic>/queues/<queue id>.lock

An instance joins by creating its member file under a dot-name beside ``members/``, taking an
exclusive flock on it, and renaming it into ``members/``: a member file in sight is always locked by a live
instance, or its instance died (the kernel dropped the lock with the process). Anyone may probe
a member by asking for a shared lock without waiting: granted means dead, and the prober
removes the file. Joins and leaves change the directory (its mtime), so the others notice at
their next look; a death shows only to a probe, made every ``consumer.rebalance_interval_ms``.

Every instance computes its share from the same sorted member list and queue ids (the
allocation strategy), but views differ while a change spreads, so shares alone could overlap.
The queue locks make that impossible: an instance consumes a queue only while it holds the
queue's flock (taken without waiting), and gives a queue up by committing its offset (when it
may) and then closing the lock. A queue whose previous owner has not let go yet is simply tried
again at the next look; one whose owner died is free at once. So no queue is ever consumed by
two live instances, and the next owner starts from the offset its predecessor committed last.

A group's files are removed (``remove_group_files``, from ``delete_consumer_group``) only when
no instance is there: the remover takes, without waiting, an exclusive lock on every file of
the topic's directory (seats, queue locks, joins under way) and unlinks them only if it got
them all, then removes the emptied directories. An instance racing with it loses nothing: a
join finding its directories gone makes them again, and a queue lock counts only when the
file locked is still the one in ``queues/`` (else it may have been unlinked under a lock
about to be granted, beside a new file someone else locks).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import stat

from mqstore.errors import CorruptStateError
from mqstore.storage.file_locks import is_file_at

GROUPS_DIR = os.path.join("consumer", "groups")
MEMBERS = "members"
QUEUES = "queues"
JOIN_ATTEMPTS = 8  # a join that finds the group's files removed under it makes them again


def group_dir(root: str, group: str, topic: str) -> str:
    return os.path.join(root, GROUPS_DIR, group, topic)


def _try_flock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class Membership:
    """This instance's seat in a group (one topic), and the queue locks it holds."""

    def __init__(self, root: str, group: str, topic: str, joined_ms: int) -> None:
        base = group_dir(root, group, topic)
        self.members_dir = os.path.join(base, MEMBERS)
        self.queues_dir = os.path.join(base, QUEUES)
        self._make_dirs()
        self.member_id = f"{os.getpid()}@{secrets.token_hex(4)}"
        self._base = base
        self._joined_ms = joined_ms
        self._queue_fds: dict[int, int] = {}
        self._seen_mtime = -1
        self._member_fd = -1
        self._join()

    def _join(self) -> None:
        # Locked before it shows in members/: a probe must never find a live seat unlocked.
        tmp = os.path.join(self._base, f".{self.member_id}.joining")
        for attempt in range(JOIN_ATTEMPTS):
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:  # the group's files are being removed: make them again
                if attempt == JOIN_ATTEMPTS - 1:
                    raise
                self._make_dirs()
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "joined_ms": self._joined_ms}).encode())
                os.rename(tmp, os.path.join(self.members_dir, self.member_id))
            except FileNotFoundError:  # the file or members/ was removed under us: again
                os.close(fd)
                _unlink(tmp)
                if attempt == JOIN_ATTEMPTS - 1:
                    raise
                self._make_dirs()
                continue
            except BaseException:
                os.close(fd)
                _unlink(tmp)
                raise
            break
        if self._member_fd >= 0:
            os.close(self._member_fd)
        self._member_fd = fd

    def _make_dirs(self) -> None:
        os.makedirs(self.members_dir, exist_ok=True)
        os.makedirs(self.queues_dir, exist_ok=True)

    # -- members --------------------------------------------------------------------------
    def changed(self) -> bool:
        """Whether members joined or left since the last ``members``."""
        try:
            return os.stat(self.members_dir).st_mtime_ns != self._seen_mtime
        except FileNotFoundError:
            return True

    def members(self) -> list[str]:
        """The live members, sorted; dead ones found on the way are removed."""
        try:
            names = os.listdir(self.members_dir)
        except FileNotFoundError:
            names = []
        if self.member_id not in names:  # someone removed the group's files: take the seat again
            self._make_dirs()
            self._join()
            names = os.listdir(self.members_dir)
        self._seen_mtime = os.stat(self.members_dir).st_mtime_ns
        return sorted(name for name in names if name == self.member_id or self._alive(name))

    def _alive(self, name: str) -> bool:
        path = os.path.join(self.members_dir, name)
        try:
            fd = _open_regular(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            if not _try_flock(fd, fcntl.LOCK_SH):
                return True
            _unlink(path)  # its process died: the lock went with it
            return False
        finally:
            os.close(fd)

    # -- queue locks ----------------------------------------------------------------------
    def try_take(self, queue_id: int) -> bool:
        if queue_id in self._queue_fds:
            return True
        path = os.path.join(self.queues_dir, f"{queue_id}.lock")
        try:
            fd = _open_regular(path, os.O_RDWR | os.O_CREAT)
        except FileNotFoundError:  # the group's files were removed: make them, try later
            self._make_dirs()
            return False
        if _try_flock(fd, fcntl.LOCK_EX) and is_file_at(fd, path):
            self._queue_fds[queue_id] = fd
            return True
        os.close(fd)  # held by another, or unlinked by remove_group_files: tried again later
        return False

    def give_up(self, queue_id: int) -> None:
        fd = self._queue_fds.pop(queue_id, None)
        if fd is not None:
            os.close(fd)

    def held(self) -> list[int]:
        return sorted(self._queue_fds)

    def leave(self) -> None:
        """Give up every queue, then the seat (callers commit first)."""
        for q in list(self._queue_fds):
            self.give_up(q)
        if self._member_fd >= 0:
            _unlink(os.path.join(self.members_dir, self.member_id))
            os.close(self._member_fd)
            self._member_fd = -1


def live_members(root: str, group: str, topic: str) -> list[str]:
    """The members of ``group`` on ``topic`` alive now (their seats are flocked), sorted;
    probing takes no seat and removes nothing."""
    members_dir = os.path.join(group_dir(root, group, topic), MEMBERS)
    try:
        names = os.listdir(members_dir)
    except FileNotFoundError:
        return []
    alive = []
    for name in sorted(names):
        try:
            fd = os.open(os.path.join(members_dir, name), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            if not _try_flock(fd, fcntl.LOCK_SH):
                alive.append(name)
        finally:
            os.close(fd)
    return alive


def groups_on_topic(root: str, topic: str) -> list[str]:
    """The groups with membership files for ``topic`` (live or left behind)."""
    base = os.path.join(root, GROUPS_DIR)
    try:
        groups = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    return [g for g in groups if os.path.isdir(os.path.join(base, g, topic))]


def topics_of_group(root: str, group: str) -> list[str]:
    """The topics ``group`` has membership files for (live or left behind)."""
    try:
        return sorted(os.listdir(os.path.join(root, GROUPS_DIR, group)))
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_group_files(root: str, group: str, topic: str | None = None) -> list[str]:
    """Remove ``group``'s membership files (of ``topic``, or of every topic) where no live
    instance is; returns the topics whose directories went. A topic's directory where any
    file is locked (a live seat, a held queue, a join under way) is left as it is."""
    gdir = os.path.join(root, GROUPS_DIR, group)
    try:
        topics = [topic] if topic is not None else sorted(os.listdir(gdir))
    except FileNotFoundError:
        return []
    removed = [t for t in topics if _remove_topic_files(os.path.join(gdir, t))]
    _rmdir(gdir)  # when no topic is left
    return removed


def _remove_topic_files(base: str) -> bool:
    if not os.path.isdir(base):
        return False
    dirs = (os.path.join(base, MEMBERS), os.path.join(base, QUEUES), base)
    locked: list[tuple[str, int]] = []
    try:
        for d in dirs:
            try:
                entries = os.listdir(d)
            except FileNotFoundError:
                continue
            for name in entries:
                path = os.path.join(d, name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                except FileNotFoundError:
                    continue  # gone meanwhile (a leave, a probe)
                except OSError:  # a link, or something else not ours
                    continue
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # members/ and queues/ themselves
                    os.close(fd)
                    continue
                if not _try_flock(fd, fcntl.LOCK_EX):
                    os.close(fd)
                    return False  # a live instance holds it: leave the topic's files alone
                locked.append((path, fd))
        for path, _fd in locked:  # every lock is ours: no instance is here
            _unlink(path)
    finally:
        for _path, fd in locked:
            os.close(fd)
    for d in dirs:
        _rmdir(d)  # only if empty: an instance that came in meanwhile keeps its directory
    return not os.path.exists(base)


def _open_regular(path: str, flags: int) -> int:
    """``path`` opened (never waiting, as a FIFO would make it), or CorruptStateError naming it
    when it is not a plain file: a directory, link or device in a member's or a queue lock's
    place is not one, and is left as it is."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ELOOP, errno.ENXIO):
            raise
        fd = -1
    if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    if fd >= 0:
        os.close(fd)
    raise CorruptStateError(f"{path} is not a plain file (consumer group membership: "
                            f"NOTE [ Group membership ]); it is left as it is: remove it")


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # not empty (someone is there), or already gone
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
