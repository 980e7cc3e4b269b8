"""Starts, watches, restarts and stops the worker processes (dispatch, flush).

NOTE [ Shutdown ]
The store and its dispatch worker share a SharedPositions segment (``workers.shm``) and two
one-way pipes: ``wake`` (the store writes a byte when new bytes are confirmed while the worker
is idle) and ``progress`` (the worker writes a byte after every batch). Pipes, not locks: a
process killed at any instant cannot leave a pipe held, so a SIGKILL never deadlocks the other
side. The flush worker follows the same pattern with its own pipes and channel.

  store process                                 dispatch worker
  1. refuse new puts, let the last append end
  2. flush.stop = 1, poke the flush worker: it commits and flushes everything written and
     exits (joined like step 5); publish append.confirmed
  3. wait <= DISPATCH_CATCH_UP_S for            ...dispatches up to confirmed, writes
     dispatched >= confirmed (progress)            a byte to progress
  4. dispatch.stop = 1, tell the monitor not to
     restart, write to wake               --->  sees STOP after its current batch, flushes
                                                what it derives (``derived_flush``),
                                                closes dispatchers, exits 0
  5. join <= STOP_TIMEOUT_S; then terminate,
     then kill
  6. unlink the shared segments, positions and transient pool (only after the workers are gone)
  7. remove ``abort`` only if dispatched == confirmed and no worker failed unrecovered

A worker also exits when its store process disappears (it polls the parent's sentinel,
``parent_alive``), so a killed store leaves no orphan. A worker that dies on its own is noticed at once by the monitor thread (it
waits on the process sentinel, no polling), logged, recorded for the store to raise on the next
call that needs dispatch, and restarted; the new worker cuts what its predecessor may have half
written past dispatched and resumes there.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
from multiprocessing import connection, resource_tracker, util

from mqstore.plugin_api.manager import DEFAULT_PLUGINS
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.uninterrupted import interrupts_blocked
from mqstore.runtime.workers import dispatch_worker, logs, shm
from mqstore.runtime.workers.pipes import poke, wait_and_drain

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0
DISPATCH_CATCH_UP_S = 5.0
QUICK_FAILURE_S = 2.0  # a worker dying this soon after starting did not get going
MAX_QUICK_FAILURES = 5


_NO_VALUE = object()
# Workers are forked from a server process that has imported these once (multiprocessing's
# forkserver), so a worker starts in milliseconds rather than re-importing numpy and mqstore
# as a spawned interpreter would; the server is single-threaded, so forking it is safe.
PRELOAD = ["mqstore.runtime.workers.dispatch_worker", "mqstore.runtime.workers.flush_worker"]


def worker_context():
    ctx = mp.get_context("forkserver")
    # Read when the server starts (once per process). The built-in plugins too: SQL92's
    # parser tables take a tenth of a second to build.
    ctx.set_forkserver_preload([*PRELOAD, *DEFAULT_PLUGINS])
    return ctx


def _entry(environ: dict, log_setup: logs.LogSetup, name: str, target, root: str, config,
           channels: shm.Channels, *args) -> None:
    # The server's environment is the one it started with; the worker takes the store
    # process's current one (plugin selection, fault injection and the like read it).
    os.environ.clear()
    os.environ.update(environ)
    logs.setup(log_setup)
    worker_log = logging.getLogger(target.__module__)
    if channels.closed:
        worker_log.warning("store %s closed before its %s worker started; the worker exits",
                           root, name)
        return
    try:
        target(root, config, channels, *args)
    except Exception as exc:
        # One line, as everything a worker logs (``workers.logs``); the store logs the exit
        # code and restarts the worker.
        worker_log.error("%s worker of %s failed", name, root, exc_info=exc)
        sys.exit(1)


@contextlib.contextmanager
def _main_module_hidden():
    """Start a worker without the user's ``__main__``.

    forkserver (like spawn) re-imports the parent's main module in the child (by path, or by
    name under ``python -m``) so that pickled references to it resolve. Workers run only
    mqstore's own functions, and re-running a user's script there would run the script's top
    level again: a script without ``if __name__ == "__main__":`` would open the store once
    more in every worker. With neither ``__file__`` nor ``__spec__`` visible, main is left
    alone.
    """
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__.get(name, _NO_VALUE) for name in ("__file__", "__spec__")} \
        if main is not None else {}
    for name in saved:
        if name == "__spec__":
            main.__spec__ = None
        else:
            main.__dict__.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _NO_VALUE:
                main.__dict__.pop(name, None)
            else:
                main.__dict__[name] = value


def _reap(proc, patience_s: float = 1.0) -> None:
    """Join a process known to be dead and make sure its exit code is read: multiprocessing
    lets any thread that starts a process reap dead children meanwhile, and a join racing
    with that reaping finds no child and returns before the code is recorded."""
    deadline = time.monotonic() + patience_s
    proc.join()
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.005)
        proc.join(0)


class WorkerSupervisor:
    """One worker process: ``target(root, config, channels, wake_r, progress_w, parent_pid,
    restarted, clock, scheduler, *extra)``; ``own_channel`` is the channel of the worker's job
    (its ``stop`` asks the worker to stop)."""

    name = "worker"

    def own_channel(self):
        raise NotImplementedError

    def __init__(self, root: str, config, channels: shm.Channels, clock, target=None,
                 extra: tuple = (), *, scheduler: Scheduler = system_scheduler) -> None:
        self.root = root
        self.config = config
        self.channels = channels
        self.clock = clock
        self.scheduler = scheduler
        self.target = target
        self.extra = extra
        self.ctx = worker_context()
        self.wake_r, self.wake_w = self.ctx.Pipe(duplex=False)
        self.progress_r, self.progress_w = self.ctx.Pipe(duplex=False)
        os.set_blocking(self.wake_w.fileno(), False)
        self.process = None
        self._starting = None  # the process being started (see ``_spawn``)
        self.restarts = 0
        self.failures: list[str] = []
        self._unreported: list[str] = []
        self._stopping = False
        self._stop_r, self._stop_w = self.ctx.Pipe(duplex=False)
        self._monitor = None
        self._started_at = 0.0
        self._quick_failures = 0
        self.gave_up: str | None = None  # why the worker is not restarted any more
        self._start_error = ""
        # A dead worker's exit code is one read from a pipe (the forkserver's): two threads
        # asking at once would leave one of them an EOF, and that process the code 255.
        self._status_lock = threading.Lock()

    def start(self) -> None:
        self._spawn(restarted=False)
        # A store left open at interpreter exit still stops its worker before multiprocessing
        # tears daemon processes down (that teardown would kill it mid-batch).
        util.Finalize(self, WorkerSupervisor._exit_stop,
                      args=(self.own_channel(), self.wake_w), exitpriority=10)
        self._monitor = threading.Thread(target=self._watch, name="mqstore-supervisor",
                                         daemon=True)
        self._monitor.start()

    def _spawn(self, restarted: bool) -> None:
        proc = self.ctx.Process(
            target=_entry, name=f"mqstore-{self.name}", daemon=True,
            args=(dict(os.environ), logs.store_logging(), self.name, self.target, self.root,
                  self.config, self.channels, self.wake_r, self.progress_w, os.getpid(),
                  restarted, self.clock, self.scheduler, *self.extra))
        # The resource tracker first, if it is not running yet: starting it ends with SIGINT
        # and SIGTERM unblocked in this thread (multiprocessing undoes its own block with
        # SIG_UNBLOCK), and inside the block below that would start the forkserver, and so
        # every worker, with them open before the worker ignores them.
        resource_tracker.ensure_running()
        # Only a started process is recorded (never join an unstarted one), before the Ctrl-C
        # held back meanwhile is raised; one that another thread took in (it then lands
        # anywhere) may cut the start short after the fork, and ``_started`` finds that
        # process. Either way an open it interrupts stops the worker, rather than leave it
        # holding the store's worker lock, or attaching after the store let its shared
        # positions go.
        self._starting = proc
        with _main_module_hidden(), interrupts_blocked():
            proc.start()
            self.process = proc
            self._started_at = time.monotonic()

    def _started(self):
        """The worker process, also one whose start was cut short before it was recorded."""
        if self.process is None and self._starting is not None \
                and self._starting.pid is not None:
            self.process = self._starting
        return self.process

    def _watch(self) -> None:
        while True:
            proc = self.process
            ready = connection.wait([proc.sentinel, self._stop_r])
            if self._stop_r in ready or self._stopping:
                return
            with self._status_lock:
                _reap(proc)
            if self._stopping:  # it died as the store stopped it: the stop reports the rest
                return
            what = f"{self.name} worker (pid {proc.pid}) exited with code {proc.exitcode}"
            while not self._restart(what):
                if self.gave_up is not None or self._stopping:
                    return
                what = f"{self.name} worker could not be started ({self._start_error})"

    def _restart(self, what: str) -> bool:
        """Report ``what`` and start a new worker; False when it could not be started (or
        the store is stopping, or the worker fails too often to go on)."""
        quick = time.monotonic() - self._started_at < QUICK_FAILURE_S
        self._quick_failures = self._quick_failures + 1 if quick else 0
        if self._quick_failures > MAX_QUICK_FAILURES:
            self.gave_up = self._fail(
                f"{what}, the {self._quick_failures}th time in a row within "
                f"{QUICK_FAILURE_S:.0f} s of starting; {self.name} stopped")
            return False
        self._fail(f"{what}; restarting it from {self.resume_point()}")
        self.restarts += 1
        # A worker that cannot start is retried with growing pauses, not in a tight loop.
        if self._stop_r.poll(min(5.0, 0.1 * 2 ** self._quick_failures) if quick else 0):
            return False
        self._started_at = time.monotonic()  # a start that fails counts as a quick failure
        try:
            self._spawn(restarted=True)
        except Exception as exc:  # e.g. the forkserver gone: one line, and tried again
            self._start_error = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def _fail(self, msg: str) -> str:
        log.error(msg)
        self.failures.append(msg)
        self._unreported.append(msg)
        return msg

    def resume_point(self) -> str:
        return "where it left off"

    @staticmethod
    def _exit_stop(channel, wake_w) -> None:
        try:
            channel.stop = 1
            poke(wake_w)
        except Exception:  # already closed
            pass

    def take_failure(self) -> str | None:
        """The oldest worker failure not yet reported to a caller, if any."""
        return self._unreported.pop(0) if self._unreported else None

    def wake(self) -> None:
        poke(self.wake_w)

    def alive(self) -> bool:
        with self._status_lock:
            return self.process is not None and self.process.is_alive()

    def kill(self) -> None:
        """End the worker at once, as the death of the store process would (tests, crashes)."""
        self._stopping = True
        self._stop_w.send(b"stop")
        proc = self._started()
        if proc is not None:
            proc.kill()
            proc.join(STOP_TIMEOUT_S)
        if self._monitor is not None:
            self._monitor.join(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Steps 4-5 of NOTE [ Shutdown ]; bounded by STOP_TIMEOUT_S (plus 2 s to kill)."""
        self._stopping = True
        self._stop_w.send(b"stop")
        self.own_channel().stop = 1
        self.wake()
        if self._monitor is not None:
            self._monitor.join(STOP_TIMEOUT_S)
        proc = self._started()
        if proc is not None:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                log.error("%s worker %d did not stop in %.0f s; terminating", self.name,
                          proc.pid, STOP_TIMEOUT_S)
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in (self._stop_r, self._stop_w, self.wake_r, self.wake_w, self.progress_r,
                     self.progress_w):
            conn.close()


class DispatchSupervisor(WorkerSupervisor):
    name = "dispatch"

    def __init__(self, root: str, config, channels: shm.Channels, clock, *,
                 scheduler: Scheduler = system_scheduler) -> None:
        super().__init__(root, config, channels, clock, dispatch_worker.run,
                         scheduler=scheduler)

    def own_channel(self) -> shm.DispatchChannel:
        return self.channels.dispatch

    def resume_point(self) -> str:
        return f"commit-log offset {self.channels.dispatch.dispatched}"

    def wait_dispatched(self, target: int, timeout: float, until_started: bool = False) -> bool:
        """Until ``dispatched`` reaches ``target`` (and with ``until_started``, until the worker
        says it caught up with the log it started on)."""
        deadline = time.monotonic() + timeout
        ch = self.channels.dispatch
        while ch.dispatched < target or (until_started and not ch.started):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.wake()
            wait_and_drain(self.progress_r, min(left, 0.05))
        return True
