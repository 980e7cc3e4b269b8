"""Fault-test helpers: deterministic messages, a writer process to hurt, and the audit after.

``FaultWriter`` runs ``mqstore.testing.fault_writer`` in its own process group (so a test can
signal the group as a terminal does) and collects its acknowledgements. ``audit`` reopens the
store and checks every acknowledged message: present at its queue offset and physical offset,
byte-identical. ``small_filesystem`` mounts a tmpfs of a given size (root only) so a store
can fill it to the last byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

TOPIC = "F"
QUEUES = 4
BORN_TIMESTAMP = 1_700_000_000_000


def body_for(seed: int, index: int) -> bytes:
    """Message ``index``'s body: its index, then 0..~300 bytes derived from the seed."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return b"%08d:" % index + digest * (digest[0] % 10)


def queue_for(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"q{seed}:{index}".encode()).digest()[:4], "big") % QUEUES


def message_for(seed: int, index: int):
    from mqstore import Message

    return Message(TOPIC, body_for(seed, index), tags=f"t{index % 3}" if index % 3 else None,
                   keys=[f"k{index}"], queue_id=queue_for(seed, index),
                   born_timestamp=BORN_TIMESTAMP)


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
    acks: list = field(default_factory=list)
    refusals: list = field(default_factory=list)
    interrupted: int = 0
    status: dict | None = None
    done: bool = False
    proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> "FaultWriter":
        spec = {"root": str(self.root), "overrides": self.overrides, "seed": self.seed,
                "count": self.count, "batch": self.batch, "then": self.then,
                "stop_after_refusals": self.stop_after_refusals, "pace_ms": self.pace_ms}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore.testing.fault_writer", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
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

    def read_until(self, acks: int | None = None) -> bool:
        """Read lines until ``acks`` acknowledgements (or the run's end); False at EOF."""
        while not self.done and (acks is None or len(self.acks) < acks):
            line = self.proc.stdout.readline()
            if not line.endswith(b"\n"):
                return False
            self._take(line)
        return True

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the writer's whole process group, as a terminal does."""
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout_s: float = 60.0) -> int:
        """Collect every line still in the pipe and wait for the process; its exit code."""
        rest, self.stderr = self.proc.communicate(timeout=timeout_s)
        self._watchdog.cancel()
        for line in rest.split(b"\n")[:-1]:
            self._take(line + b"\n")
        return self.proc.returncode

    def kill(self, signum: int = signal.SIGKILL) -> int:
        """Signal the whole group, then collect what it said before it died."""
        self.signal_group(signum)
        return self.finish()


@dataclass
class Audit:
    acked: int
    lost: list
    wrong: list

    def __str__(self) -> str:
        return f"acked {self.acked}, lost {len(self.lost)}, wrong {len(self.wrong)}"


def audit(store, seed: int, acks: list) -> Audit:
    """Check every acknowledged message against ``store``: found by its physical offset and
    by a pull at its queue offset, byte-identical. Other surviving messages are fine."""
    lost, wrong = [], []
    for ack in acks:
        msg = store.message_at(ack.phys_offset)
        expected = body_for(seed, ack.index)
        if msg is None:
            lost.append(ack)
            continue
        got = store.get("audit", TOPIC, ack.queue_id, ack.queue_offset, 1)
        pulled = got.messages[0] if got is not None and got.messages else None
        if (msg.body != expected or msg.queue_offset != ack.queue_offset
                or msg.queue_id != ack.queue_id or pulled is None
                or pulled.body != expected or pulled.phys_offset != ack.phys_offset):
            wrong.append(ack)
    return Audit(len(acks), lost, wrong)


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


def resize_filesystem(path: str, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", path], check=True,
                   capture_output=True)
