"""Staging leases: a lock on a staged directory, held for as long as its job's driver lives.

NOTE [ Staging leases ]
A write's rows wait in staged files between its tasks and its commit (``staging``). When the
driver dies (SIGKILL, OOM, a lost host), nobody commits or aborts, and the files stay. A later
write sweeps them, and must tell them apart from the staging of a job that is still running.
Age cannot tell: a long job and a dead one look the same. A lock can: every staged directory
is flock-ed by a *lease process* that lives exactly as long as the job needs it, and the
sweeper removes only directories whose lock it can take (``staging.sweep``).

* The lock is taken by the Spark worker that creates the writer (the driver side), on the
  directory itself, before any task can stage into it. The directory is made and locked while
  that worker holds the staging directory's own lock, which every sweep takes too, so no sweep
  ever sees it unlocked. The locked file descriptor is then handed to the lease process
  (``pass_fds``), which keeps the same open file description and so the same lock.
* The lease process ends, and the kernel drops the lock, when (a) the directory is removed (the
  commit or abort removed it: the job is over) or (b) the driver exits. The driver is the JVM
  the creating worker serves: its first ancestor not running this Python (worker -> pyspark
  daemon -> java). It is watched through a pidfd, so a recycled pid is never mistaken for it.
  The lease also dies with the daemon's process group when Spark shuts its workers down, and a
  SIGKILL of the lease itself only makes its job sweepable (the worst case: that job's commit
  fails on a missing file and appends nothing).
* The lease process is a double fork (the creating worker reaps the intermediate at once, so no
  zombie is left behind in Spark's long-lived workers), runs this file with ``-I -S`` (the
  standard library only: no mqstore, no pyspark) and keeps none of the worker's descriptors
  but the lock (its standard streams are /dev/null, so Spark never waits on it).
* Batch jobs lease ``job-<uuid>/``, one lease per job. A stream leases its sink's directory
  ``stream-<sink>/`` (micro-batches stage in ``batch-<id>/`` inside it), taken by the first
  writer Spark creates for a micro-batch; the commit removes the batch and then the sink's
  directory once empty, which ends that lease. A writer that finds the sink's directory
  already leased (by another live driver writing the same sink: a misuse the sink ledger
  does not support either) relies on that lease.

The locks are flock(2) locks: advisory, per open file description, released by the kernel when
the last descriptor closes, whatever way the process ends. On a shared filesystem they are as
good as its flock support (NFSv4 maps them to byte-range locks).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.2  # how often the lease looks at its directory (driver exits wake it at once)

Driver = tuple[int, int]  # (pid, start time in clock ticks since boot): one process, ever


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from the state on (comm may hold spaces)


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process(pid: int) -> Driver | None:
    """``pid`` as a Driver (with its start time), or None when it is not running."""
    started = start_time(pid)
    return None if started is None else (pid, started)


def spark_driver() -> Driver | None:
    """The Spark driver this worker serves: the first ancestor running another executable
    than this interpreter (Spark's Python workers are forked by a pyspark daemon of the same
    interpreter, itself started by the driver's JVM). None without /proc."""
    try:
        mine = os.readlink("/proc/self/exe")
    except OSError:
        return None
    pid = os.getppid()
    while pid > 1:
        fields = _stat_fields(pid)
        if fields is None:
            return None
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None  # another user's process: not one of ours
        if exe != mine:
            return pid, int(fields[19])
        pid = int(fields[1])
    return None


def hand_over(fd: int, driver: Driver | None) -> None:
    """Give the lock on ``fd`` (a locked directory) to a lease process; the caller may close
    ``fd`` once this returns. ``driver``: the process whose exit ends the lease (None: only the
    directory's removal does)."""
    pid, started = driver if driver is not None else (0, 0)
    subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__), str(fd), str(pid),
                    str(started)],
                   pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True, timeout=60)


def _driver_gone(pid: int, started: int):
    """A callable that waits up to ``POLL_S`` for the driver to exit: True once it has."""
    def never() -> bool:
        time.sleep(POLL_S)
        return False

    def start_changed() -> bool:  # without a pidfd (an old kernel)
        time.sleep(POLL_S)
        return start_time(pid) != started

    if not pid:
        return never
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if start_time(pid) != started:  # gone already, or the pid is another process's now
        return lambda: True
    if pidfd is None:
        return start_changed
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)  # readable once the process has exited
    return lambda: bool(poller.poll(POLL_S * 1000))


def _hold(fd: int, pid: int, started: int) -> None:
    gone = _driver_gone(pid, started)
    while os.fstat(fd).st_nlink:  # 0 once the directory is removed: the job is over
        if gone():
            return


def main(argv: list[str]) -> int:
    fd, pid, started = (int(a) for a in argv[1:4])
    if os.fork():
        return 0  # the creating worker reaps this intermediate at once
    # It stays in the worker's process group, which Spark's daemon hangs up at its shutdown.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    try:
        _hold(fd, pid, started)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
