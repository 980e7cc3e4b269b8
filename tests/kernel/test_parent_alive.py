"""``parent_alive``: a worker learns that the process that started it is gone, however often it
asks (the dispatch worker asks on every pass)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from mqstore.uninterrupted import parent_alive

GONE_TIMEOUT_S = 60.0


def _grandchild(out) -> None:
    out.send([parent_alive() for _ in range(3)])  # asked again and again while it lives
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while parent_alive():
        if time.monotonic() > deadline:
            out.send("still alive")
            return
        time.sleep(0.01)
    out.send([parent_alive() for _ in range(3)])


def _middle(out, release) -> None:
    child = mp.get_context("spawn").Process(target=_grandchild, args=(out,))
    child.start()
    release.recv()
    os._exit(0)  # gone without a word to the child


def test_a_worker_sees_its_parent_alive_then_gone():
    ctx = mp.get_context("spawn")
    results_r, results_w = ctx.Pipe(duplex=False)
    release_r, release_w = ctx.Pipe(duplex=False)
    middle = ctx.Process(target=_middle, args=(results_w, release_r))
    middle.start()
    try:
        assert results_r.poll(GONE_TIMEOUT_S)
        assert results_r.recv() == [True, True, True]
        release_w.send(None)
        middle.join(GONE_TIMEOUT_S)
        assert middle.exitcode == 0
        assert results_r.poll(GONE_TIMEOUT_S)
        assert results_r.recv() == [False, False, False]
    finally:
        if middle.is_alive():
            middle.kill()


def test_a_process_nobody_started_has_its_parent():
    assert mp.parent_process() is None
    assert parent_alive()
