"""Fault-test helpers: deterministic messages, a writer process to hurt, and the audit after.

``FaultWriter`` runs ``mqstore.testing.fault_writer`` in its own process group (so a test can
signal the group as a terminal does) and collects its acknowledgements. ``audit`` reopens the
store and checks every acknowledged message: present at its queue offset and physical offset,
byte-identical. ``small_filesystem`` mounts a tmpfs of a given size (root only) so a store
can fill it to the last byte; ``fill_filesystem`` takes every byte still free.

This module is also a plugin (``plugins.modules: [mqstore.testing.faults]``): it registers the
writers ``mmap_ctrl_c`` and ``transient_pool_ctrl_c``, the built-in ones except that right
after copying the Nth record block (N listed in ``$MQSTORE_FAULT_SIGINT_AFTER_WRITES``, e.g.
``"17,230"``) they send SIGINT to their own process group, as a terminal's Ctrl-C: the
signal then lands exactly between a put's bytes and its queue-offset update. After the Nth
listed in ``$MQSTORE_FAULT_SIGKILL_AFTER_WRITES`` they SIGKILL their process group instead:
the process dies with the bytes written and nothing after them done (a schedule's delivered
copies in the log, its progress not yet recorded). (The mmap one wraps
the registered ``mmap`` writer; the transient-pool one subclasses the core's pool writer, since
only that writer stages.)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

from mqstore.plugin_api.hookspecs import hookimpl
from mqstore.append.pool_writer import TransientPoolWriter

TOPIC = "F"
QUEUES = 4
BORN_TIMESTAMP = 1_700_000_000_000
BLANK_MAGIC = -875286124  # 0xCBD43194, the record that closes a commit-log segment
SIGINT_AFTER_WRITES_ENV = "MQSTORE_FAULT_SIGINT_AFTER_WRITES"
SIGKILL_AFTER_WRITES_ENV = "MQSTORE_FAULT_SIGKILL_AFTER_WRITES"


def body_for(seed: int, index: int) -> bytes:
    """Message ``index``'s body: its index, then 0..~300 bytes derived from the seed."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return b"%08d:" % index + digest * (digest[0] % 10)


def queue_for(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"q{seed}:{index}".encode()).digest()[:4], "big") % QUEUES


def tags_for(index: int) -> str | None:
    return f"t{index % 3}" if index % 3 else None


def message_for(seed: int, index: int):
    from mqstore.message import Message

    return Message(TOPIC, body_for(seed, index), tags=tags_for(index), keys=[f"k{index}"],
                   queue_id=queue_for(seed, index), born_timestamp=BORN_TIMESTAMP)


def small_store_overrides(**sections) -> dict:
    """Small files everywhere (64 KiB segments, 1,000-unit queues, small index files), so a
    few thousand messages cross many segment and file boundaries; worker processes stay the
    default. ``sections`` merge on top."""
    base = {
        "commit_log": {"segment_bytes": 64 * 1024},
        "consume_queue": {"file_units": 1000, "ext_file_bytes": 64 * 1024},
        "index": {"max_hash_slots": 1000, "max_index_entries": 4000},
        "store": {"hash": "java"},
        "plugins": {"load_entry_points": False},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


@dataclass
class Ack:
    index: int
    queue_id: int
    queue_offset: int
    phys_offset: int


@dataclass
class FaultWriter:
    """The writer process and what it said; ``lines`` keeps every raw line."""

    root: str
    overrides: dict
    seed: int = 0
    count: int = 1 << 30
    batch: int = 0
    stop_after_refusals: int = 1 << 62
    then: str = "wait"
    pace_ms: int = 0
    wait_s: float = 30.0
    sigint_after_writes: tuple = ()  # with a *_ctrl_c writer: see the module docstring
    late_handler: bool = False  # set the program's own SIGINT handler after the open
    stop_on_eof: bool = False  # put until ``finish`` closes the writer's stdin
    scheduler: object = None  # a ManualScheduler the writer's store runs its loops on
    acks: list = field(default_factory=list)
    refusals: list = field(default_factory=list)
    interrupted: int = 0
    status: dict | None = None
    done: bool = False
    proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> "FaultWriter":
        spec = {"root": str(self.root), "overrides": self.overrides, "seed": self.seed,
                "count": self.count, "batch": self.batch, "then": self.then,
                "stop_after_refusals": self.stop_after_refusals, "pace_ms": self.pace_ms,
                "wait_s": self.wait_s, "sigint_after_writes": list(self.sigint_after_writes),
                "late_handler": self.late_handler, "stop_on_eof": self.stop_on_eof,
                "scheduler": None if self.scheduler is None else self.scheduler.name}
        # stderr goes to a file: workers log there too, and a pipe nobody reads while the
        # writer runs could fill up and block them.
        self._stderr_file = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore.testing.fault_writer", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr_file,
            start_new_session=True, preexec_fn=_terminal_signals)
        self._watchdog = threading.Timer(timeout_s, self._kill_group)
        self._watchdog.daemon = True
        self._watchdog.start()
        return self

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _take(self, line: bytes) -> None:
        kind, _, rest = line.decode().rstrip("\n").partition(" ")
        if kind == "ack":
            # A message sent again after an interrupt may be acknowledged twice; both copies
            # are stored and both acknowledgements are checked.
            self.acks.append(Ack(*map(int, rest.split())))
        elif kind == "refused":
            self.refusals.append(rest)
        elif kind == "interrupted":
            self.interrupted += 1
        elif kind == "status":
            self.status = json.loads(rest)
        elif kind == "done":
            self.done = True

    def read_until(self, acks: int | None = None, interrupted: int | None = None) -> bool:
        """Read lines until ``acks`` acknowledgements, or ``interrupted`` interrupted lines, or
        the run's end (neither given); False at EOF (the writer is gone)."""
        def reached() -> bool:
            if acks is None and interrupted is None:
                return False
            return ((acks is not None and len(self.acks) >= acks)
                    or (interrupted is not None and self.interrupted >= interrupted))

        while not self.done and not reached():
            line = self.proc.stdout.readline()
            if not line.endswith(b"\n"):
                return False
            self._take(line)
        return True

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the writer's whole process group, as a terminal does."""
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout_s: float = 60.0) -> int:
        """Close the writer's stdin (a writer told to wait leaves), collect every line still
        to come and wait for the process (its group killed after ``timeout_s``); its exit
        code."""
        late = threading.Timer(timeout_s, self._kill_group)
        late.daemon = True
        late.start()
        try:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            # Through the reader ``read_until`` used: lines it read ahead wait in its buffer,
            # where communicate(), reading the pipe itself, would never see them.
            rest = self.proc.stdout.read()
            self.proc.wait()
        finally:
            late.cancel()
            self._watchdog.cancel()
        self._stderr_file.seek(0)
        self.stderr = self._stderr_file.read()
        self._stderr_file.close()
        for line in rest.split(b"\n")[:-1]:
            self._take(line + b"\n")
        return self.proc.returncode

    def kill(self, signum: int = signal.SIGKILL, *, group: bool = True) -> int:
        """Signal the whole group (``group=False``: the writer process alone, as when only the
        store's process dies: its workers see that and exit), then collect what it said
        before it died."""
        if group:
            self.signal_group(signum)
        else:
            os.kill(self.proc.pid, signum)
        return self.finish()


def store_left_by_writer(root, overrides: dict, seed: int, count: int, how: str) -> list:
    """A store written by the fault writer process and left ``"clean"`` (closed) or
    ``"killed"`` (SIGKILL of its whole group, ``abort`` left behind); returns its acks.

    A killed writer is killed once its derived files were forced after the last put (the key
    index recorded progress covering every record), as a writer that ran for a second or more
    is: how far the periodic forcing got must not depend on how fast the machine is."""
    writer = FaultWriter(str(root), overrides, seed=seed, count=count, batch=0,
                         then="close" if how == "clean" else "wait")
    writer.start()
    assert writer.read_until()
    if how == "clean":
        assert writer.finish() == 0
        assert not os.path.exists(os.path.join(root, "abort"))
    else:
        if writer.acks and overrides.get("index", {}).get("enabled", True):
            _wait_index_progress(root, max(a.phys_offset for a in writer.acks) + 1)
        writer.kill(signal.SIGKILL)
        assert os.path.exists(os.path.join(root, "abort"))
    assert len(writer.acks) == count
    return writer.acks


def _wait_index_progress(root, past: int, timeout: float = 60.0) -> None:
    """Until the key index's recorded progress (``mqstore.indexed``) reaches ``past``."""
    from mqstore.storage.index_progress import read_progress
    from mqstore.testing import wait_for

    def covered():
        progress, _problem = read_progress(str(root))
        return progress is not None and progress.indexed_until >= past

    wait_for(covered, timeout=timeout, what=f"index progress past commit-log offset {past}")


@dataclass
class Audit:
    acked: int
    lost: list
    wrong: list

    def __str__(self) -> str:
        return f"acked {self.acked}, lost {len(self.lost)}, wrong {len(self.wrong)}"


def audit(store, seed: int, acks: list) -> Audit:
    """Check every acknowledged message against ``store``: found by its physical offset and
    by a pull at its queue offset, byte-identical. A message that is not there, reported
    damaged, or unreachable through its queue is lost; one served with another body, born
    time, tag or key, at another offset or from another record is wrong. Other surviving
    messages are fine."""
    from mqstore.errors import CorruptRecordError

    lost, wrong = [], []
    for ack in acks:
        expected = body_for(seed, ack.index)
        try:
            msg = store.message_at(ack.phys_offset)
        except CorruptRecordError:
            msg = None
        if msg is None:
            lost.append(ack)
            continue
        if (msg.body != expected or msg.queue_offset != ack.queue_offset
                or msg.queue_id != ack.queue_id or msg.born_timestamp != BORN_TIMESTAMP
                or msg.tags != tags_for(ack.index) or msg.keys != [f"k{ack.index}"]):
            wrong.append(ack)
            continue
        got = store.get("audit", TOPIC, ack.queue_id, ack.queue_offset, 1)
        if got is None or not got.messages or got.messages[0].queue_offset != ack.queue_offset:
            lost.append(ack)
        elif got.messages[0].body != expected or got.messages[0].phys_offset != ack.phys_offset:
            wrong.append(ack)
    return Audit(len(acks), lost, wrong)


def stored_records(store) -> list:
    """Every message record of the commit log in log order (segment-closing blanks stepped
    over); AssertionError at bytes that are neither."""
    records = []
    pos, end = max(0, store.min_phys_offset), store.max_phys_offset
    while pos < end:
        msg = store.message_at(pos)
        if msg is not None:
            records.append(msg)
            pos += msg.size
            continue
        head = store.internals.commit_log.read(pos, 8)
        size, magic = struct.unpack(">ii", bytes(head)) if head is not None else (0, 0)
        if magic != BLANK_MAGIC or size <= 0:
            raise AssertionError(f"neither a message nor a blank at commit-log offset {pos} "
                                 f"(log ends at {end})")
        pos += size
    return records


def pulled_queue(store, queue_id: int, topic: str = TOPIC, *, end: int | None = None) -> list:
    """Every message of one queue, pulled 32 at a time from its min offset to its max (or to
    ``end``: fillers after it lead to no message)."""
    messages, offset = [], store.min_offset(topic, queue_id)
    end = store.max_offset(topic, queue_id) if end is None else end
    while offset < end:
        got = store.get("faults", topic, queue_id, offset, 32)
        if got is None or not got.messages:
            raise AssertionError(f"queue {topic}/{queue_id}: pull at {offset} of {end} found "
                                 f"{None if got is None else got.status.name}")
        messages += got.messages
        offset = got.next_begin_offset
    return messages


@contextlib.contextmanager
def small_filesystem(path: str, size_bytes: int):
    """A tmpfs of ``size_bytes`` mounted at ``path`` for the duration (needs root)."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", path],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)


def fill_filesystem(path: str) -> int:
    """Grab every byte still free on ``path``'s file system with a file at ``path``: os.write
    in chunks halved on each ENOSPC down to a single byte (a buffered file would only fail at
    close). Returns the bytes written; the file stays open nowhere."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    total, chunk = 0, 1 << 20
    zeros = bytes(chunk)
    try:
        while chunk:
            try:
                total += os.write(fd, zeros[:chunk])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return total


def resize_filesystem(path: str, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", path], check=True,
                   capture_output=True)


def _terminal_signals() -> None:
    """The writer meets Ctrl-C as a program started from a terminal does: with Python's own
    handler. A runner started in the background by a shell without job control (``cmd &`` in
    a script, a CI step) ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# -- Ctrl-C at the worst moment (a plugin: see the module docstring) -------------------------
def _interrupt_after_writes(env: str = SIGINT_AFTER_WRITES_ENV) -> set[int]:
    raw = os.environ.get(env, "")
    return {int(n) for n in raw.split(",") if n.strip()}


def _wrote(writer) -> None:
    """Count one record copy; SIGINT (or SIGKILL) to the process group after the chosen
    ones."""
    writer.writes += 1
    if writer.writes in writer.interrupt_after:
        os.killpg(0, signal.SIGINT)  # the whole group, as a terminal does
    if writer.writes in _interrupt_after_writes(SIGKILL_AFTER_WRITES_ENV):
        os.killpg(0, signal.SIGKILL)


class _Interrupting:
    """Wraps a registered (plain) writer; sends SIGINT to the process group after chosen
    writes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.writes = 0
        self.interrupt_after = _interrupt_after_writes()

    def write(self, segment, data) -> int:
        pos = self.inner.write(segment, data)
        _wrote(self)
        return pos

    def write_blank(self, segment, data) -> int:
        return self.inner.write_blank(segment, data)

    def before_roll(self) -> None:
        self.inner.before_roll()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name):  # the inner writer's own counters
        return getattr(self.inner, name)


class _InterruptingPoolWriter(TransientPoolWriter):
    """The core's transient-pool writer itself, sending SIGINT after chosen writes. Staging is
    the core's pool writer's alone (``mqstore.append.pool_writer``): a wrapper around it would be a
    plain writer, so this one is a subclass."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.writes = 0
        self.interrupt_after = _interrupt_after_writes()
        self._in_blank = False

    def write(self, segment, data) -> int:
        pos = super().write(segment, data)
        if not self._in_blank:  # blanks are not counted (its write_blank calls write)
            _wrote(self)
        return pos

    def write_blank(self, segment, data) -> int:
        self._in_blank = True
        try:
            return super().write_blank(segment, data)
        finally:
            self._in_blank = False


def _interrupting(registry, base: str):
    # Looked up when a store builds its writer: the built-in writers register after this hook.
    return lambda ctx: _Interrupting(registry.get(base)(ctx))


@hookimpl
def register_writers(registry):
    registry.add("mmap_ctrl_c", _interrupting(registry, "mmap"))
    registry.add("transient_pool_ctrl_c", _InterruptingPoolWriter)
