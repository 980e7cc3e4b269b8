"""Ctrl-C and SIGTERM to a writer's whole process group: a put is all-or-nothing.

A real writer process (``mqstore.testing.fault_writer``, dispatch and flush in worker processes
as by default) puts deterministic messages; the test sends SIGINT to its whole process group,
as a terminal's Ctrl-C does, several times at seeded moments during puts (single and batched,
both writers, both flush modes). The writer catches the KeyboardInterrupt around its put,
prints ``interrupted`` and sends the same messages again (a producer's retry; a message may
then be stored twice, under two queue offsets). A KeyboardInterrupt landing outside the put
kills the writer instead; that is a valid outcome too, and then the reopened store must hold
every acknowledgement.

After each signal the test waits for the writer's answer (its ``interrupted`` line, or its end)
before the next one. Then, on the reopened store:

- every acknowledged message is at its queue offset and physical offset, byte-identical;
- no two acknowledgements and no two records in the commit log share a (topic, queue, queue
  offset), and every queue holds offsets 0..max-1 with no gap, each unit pointing at the
  record that names that offset;
- the writer (when it lived) saw its dispatch and flush workers alive, never restarted, and its
  final ``wait_dispatched`` did not raise: Ctrl-C reached them and they left it to the parent.

Random moments rarely hit the few bytecodes between a put's copy and its offset update, so
``test_ctrl_c_between_the_bytes_and_the_offsets`` aims there: the ``*_ctrl_c`` writers of
``mqstore.testing.faults`` signal their group from inside the copy (without the store's signal
deferral, it fails: a queue offset is given out twice). ``test_ctrl_c_outside_a_put_*`` makes
the writer die of its Ctrl-C. ``test_sigterm_*``: SIGTERM to the whole group kills the writer
at once (default action) while its workers finish their work; every acknowledged message,
staged in the transient pool or not, is there on reopen, also when the workers were still
starting.

Combinations: half fractions (every pair of factors in all four combinations) by default;
``MQSTORE_FAULT_ROUNDS=N`` runs every combination with N seeds. ``-s`` prints one "acked N,
lost 0, wrong 0" line per run.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.testing.faults import (
    QUEUES, TOPIC, FaultWriter, audit, body_for, pulled_queue, small_store_overrides,
    stored_records,
)

ROUNDS = int(os.environ.get("MQSTORE_FAULT_ROUNDS", "0"))
SEEDS = range(ROUNDS or 1)
SIGNALS = 5  # SIGINTs per run
COUNT = 1000  # messages each run puts at least (more are sent again after interrupts)
WRITER_TIMEOUT_S = 90.0
PACE_MS = 40  # the pause between puts in test_ctrl_c_outside_a_put_*

KINDS = ["mmap", "transient_pool"]
MODES = ["async", "sync"]
BATCHES = [0, 16]


def index_of(body: bytes) -> int:
    return int(body[:8])


def open_store(root, overrides) -> MessageStore:
    return MessageStore.open(root, config=load_config(overrides=overrides))


def check_store(root, overrides, writer: FaultWriter, seed: int) -> tuple[str, int]:
    """Everything the module docstring lists for the reopened store; a summary line and the
    number of message records in the commit log."""
    acks = writer.acks
    pairs = Counter((a.queue_id, a.queue_offset) for a in acks)
    assert [p for p, n in pairs.items() if n > 1] == [], "two PUT_OKs with one queue offset"
    assert len({a.phys_offset for a in acks}) == len(acks), "two PUT_OKs at one phys offset"

    store = open_store(root, overrides)
    try:
        store.wait_dispatched(timeout=30.0)
        result = audit(store, seed, acks)
        assert (result.lost, result.wrong) == ([], []), str(result)

        records = stored_records(store)
        seen = Counter((m.topic, m.queue_id, m.queue_offset) for m in records)
        assert [k for k, n in seen.items() if n > 1] == [], \
            "two records in the commit log share a (topic, queue, queue offset)"
        by_phys = {m.phys_offset: m for m in records}
        for queue_id in range(QUEUES):
            end = store.max_offset(TOPIC, queue_id)
            pulled = pulled_queue(store, queue_id)
            assert store.min_offset(TOPIC, queue_id) == 0
            offsets = [m.queue_offset for m in pulled]
            assert offsets == list(range(len(offsets))), f"queue {queue_id}: offsets not dense"
            assert len(offsets) == end == store.max_offset(TOPIC, queue_id), \
                (f"queue {queue_id}: max offset {end}, {len(offsets)} messages pulled, max "
                 f"offset {store.max_offset(TOPIC, queue_id)} after the pulls")
            for m in pulled:
                record = by_phys.get(m.phys_offset)
                assert record is not None and record.queue_offset == m.queue_offset \
                    and record.queue_id == queue_id, (queue_id, m.queue_offset, m.phys_offset)
                assert m.body == body_for(seed, index_of(m.body))
        assert sum(store.max_offset(TOPIC, q) for q in range(QUEUES)) == len(records)
        stored = {index_of(m.body) for m in records}
        assert {a.index for a in acks} <= stored

        # The store goes on from there.
        before = store.max_offset(TOPIC, 2)
        r = store.put(Message(TOPIC, b"after the interrupts", queue_id=2))
        assert r.status is PutStatus.PUT_OK, r
        assert r.queue_offset == before
        store.wait_dispatched(timeout=30.0)
        got = store.get("g", TOPIC, 2, r.queue_offset, 1)
        assert got.status is GetStatus.FOUND and got.messages[0].body == b"after the interrupts"
        return f"{result}; {len(records)} records for {len(stored)} messages", len(records)
    finally:
        store.close()


def check_workers(writer: FaultWriter) -> None:
    status = writer.status
    assert status is not None, writer.stderr.decode(errors="replace")[-4000:]
    assert "wait_dispatched" not in status, status["wait_dispatched"]
    for name in ("dispatch", "flush"):
        worker = status[name]
        assert worker["mode"] == "process", status
        assert worker["alive"] is True, (name, status)
        assert (worker["restarts"], worker["failures"]) == (0, []), (name, status)
    assert status["interrupted"] == writer.interrupted


def died_of_the_interrupt(writer: FaultWriter, code: int) -> None:
    """A KeyboardInterrupt nobody caught: Python exits through SIGINT after its atexit work."""
    err = writer.stderr.decode(errors="replace")
    assert code == -signal.SIGINT, f"exit code {code}:\n{err[-4000:]}"
    assert "KeyboardInterrupt" in err, err[-4000:]
    assert not writer.done


def _half_fraction(id_of, *factors) -> list:
    """Every combination of three two-level factors, halved by default (each pair of factors
    still meets in all four combinations), all of them with MQSTORE_FAULT_ROUNDS; one case
    per seed."""
    cases = []
    for (i, a), (j, b), (k, c) in itertools.product(*(enumerate(f) for f in factors)):
        if ROUNDS or (i + j + k) % 2 == 0:
            cases += [pytest.param(a, b, c, seed, id=f"{id_of(a, b, c)}-{seed}")
                      for seed in SEEDS]
    return cases


def _ctrl_c_cases():
    return _half_fraction(lambda kind, mode, batch: f"{kind}-{mode}-{'batch' if batch else 'put'}",
                          KINDS, MODES, BATCHES)


@pytest.mark.parametrize("kind, mode, batch, seed", _ctrl_c_cases())
@pytest.mark.slow
def test_ctrl_c_during_puts_splits_no_put(tmp_path, watchdog, kind, mode, batch, seed):
    began = time.monotonic()
    rng = random.Random(f"{kind}:{mode}:{batch}:{seed}")
    root = tmp_path / "store"
    overrides = small_store_overrides(writer={"kind": kind}, flush={"policy": mode})
    # It puts until told to stop (its stdin closed by ``finish``): however far ahead of this
    # process it runs on a loaded machine, every SIGINT lands among its puts.
    writer = FaultWriter(root, overrides, seed=seed, batch=batch, stop_on_eof=True,
                         then="close").start(timeout_s=WRITER_TIMEOUT_S)
    sent = 0
    # Acknowledgement counts after which a SIGINT goes out, all well before the last put.
    targets = sorted(rng.sample(range(10, COUNT * 3 // 4), SIGNALS))
    try:
        alive = True
        for target in targets:
            if not writer.read_until(max(target, len(writer.acks) + 1)) or writer.done:
                alive = False
                break
            time.sleep(rng.uniform(0, 0.002))  # not a synchronisation: where in a put it lands
            writer.signal_group(signal.SIGINT)
            sent += 1
            # The writer answers every SIGINT: an "interrupted" line, or it is gone.
            if not writer.read_until(interrupted=sent):
                alive = False
                break
        if alive:
            writer.read_until(acks=COUNT)
    finally:
        code = writer.finish()
    err = writer.stderr.decode(errors="replace")
    indexes = {a.index for a in writer.acks}
    if writer.done:
        assert code == 0, f"exit code {code}:\n{err[-4000:]}"
        assert sent == SIGNALS and writer.interrupted == SIGNALS
        check_workers(writer)
        assert writer.refusals == []
        # COUNT acknowledgements were read, a put repeated after an interrupt counted twice:
        # the distinct indexes reach past every signal's target, with no gap.
        assert len(indexes) >= COUNT * 3 // 4 and indexes == set(range(len(indexes)))
        outcome = f"{writer.interrupted} interrupts caught"
    else:
        died_of_the_interrupt(writer, code)
        assert writer.refusals == []
        outcome = f"died of interrupt {sent} ({writer.interrupted} caught before)"
    summary, records = check_store(root, overrides, writer, seed)
    if writer.done:  # only a retry stores a message twice
        assert len(indexes) <= records <= len(indexes) + writer.interrupted * max(1, batch)
    print(f"\n{kind} {mode} {'put_batch' if batch else 'put'} seed {seed}: {outcome}; "
          f"{summary}; {time.monotonic() - began:.1f} s")


def _between_cases():
    # Every writer and put kind with the default handler; the program's own handler, set
    # after the open, with each put kind.
    return [(kind, batch, False, seed) for kind in KINDS for batch in BATCHES for seed in SEEDS] \
        + [("mmap", batch, True, seed) for batch in BATCHES for seed in SEEDS]


@pytest.mark.parametrize("kind, batch, late_handler, seed", _between_cases())
@pytest.mark.slow
def test_ctrl_c_between_the_bytes_and_the_offsets(tmp_path, watchdog, kind, batch,
                                                  late_handler, seed):
    """The worst moment, hit on purpose: the ``*_ctrl_c`` writers (``mqstore.testing.faults``)
    send SIGINT to their whole process group right after copying a put's records, before the
    store advances the queue offsets. The put must still complete (the KeyboardInterrupt comes
    after it), so the writer's retry stores the messages again under new offsets and no queue
    offset is handed out twice. With ``late_handler`` the writer sets its own SIGINT handler
    after opening the store, as a program with a graceful shutdown does."""
    rng = random.Random(f"between:{kind}:{batch}:{late_handler}:{seed}")
    count = 800
    # A put makes at most three writes (a blank closing a segment, and a batch's two blocks
    # around another blank): four apart, no two of them fall in one put. The last put,
    # perhaps a short batch, is left alone.
    puts = count // max(1, batch)
    writes = sorted(4 * n for n in rng.sample(range(1, puts // 4 - 1), SIGNALS))
    root = tmp_path / "store"
    overrides = small_store_overrides(writer={"kind": kind})
    writer = FaultWriter(root, small_store_overrides(
                             writer={"kind": f"{kind}_ctrl_c"},
                             plugins={"modules": ["mqstore.testing.faults"]}),
                         seed=seed, count=count, batch=batch, then="close",
                         sigint_after_writes=writes,
                         late_handler=late_handler).start(timeout_s=WRITER_TIMEOUT_S)
    try:
        writer.read_until()
    finally:
        code = writer.finish()
    err = writer.stderr.decode(errors="replace")
    assert code == 0 and writer.done, f"exit code {code}:\n{err[-4000:]}"
    assert writer.interrupted == SIGNALS, err[-4000:]
    check_workers(writer)
    assert writer.refusals == []
    assert len({a.index for a in writer.acks}) == count
    summary, records = check_store(root, overrides, writer, seed)
    # Every interrupted put was complete: its messages are stored twice, once by the retry.
    assert records == count + SIGNALS * max(1, batch)
    print(f"\n{kind} {'put_batch' if batch else 'put'} seed {seed}: SIGINT after writes "
          f"{writes}; {summary}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", BATCHES, ids=["put", "batch"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_ctrl_c_outside_a_put_ends_the_writer_and_keeps_every_ack(tmp_path, watchdog, kind,
                                                                  batch, seed):
    """The writer pauses between puts, outside its ``try``: a Ctrl-C there is not caught and
    ends the program; the store (closed at exit or not) holds every acknowledgement."""
    rng = random.Random(f"outside:{kind}:{batch}:{seed}")
    root = tmp_path / "store"
    overrides = small_store_overrides(writer={"kind": kind})
    writer = FaultWriter(root, overrides, seed=seed, batch=batch, pace_ms=PACE_MS,
                         then="close").start(timeout_s=WRITER_TIMEOUT_S)
    sent = 0
    try:
        for _ in range(10):  # a signal that lands inside a put is caught: try again
            if not writer.read_until(len(writer.acks) + max(1, batch) * rng.randint(2, 20)):
                break
            # The writer printed its acknowledgements and is leaving its try; its pause of
            # PACE_MS follows. No line marks the pause: aim at its middle.
            time.sleep(PACE_MS / 2000)
            writer.signal_group(signal.SIGINT)
            sent += 1
            if not writer.read_until(interrupted=sent):
                break
        else:
            writer.kill()
            pytest.fail(f"{sent} SIGINTs sent in the writer's pauses, every one caught")
    finally:
        code = writer.finish()
    died_of_the_interrupt(writer, code)
    assert writer.refusals == [] and writer.acks
    summary, _records = check_store(root, overrides, writer, seed)
    print(f"\n{kind} {'put_batch' if batch else 'put'} seed {seed}: died at SIGINT {sent}; "
          f"{summary}")


def _sigterm_cases():
    return _half_fraction(lambda kind, batch, when: f"{kind}-{'batch' if batch else 'put'}-{when}",
                          KINDS, BATCHES, ["early", "later"])


@pytest.mark.parametrize("kind, batch, when, seed", _sigterm_cases())
@pytest.mark.slow
def test_sigterm_to_the_group_keeps_every_ack(tmp_path, watchdog, kind, batch, when, seed):
    """SIGTERM kills the writer at once (default action); its workers commit (the transient
    pool's staged bytes too) and flush what was written, then exit. Every acknowledgement
    survives, ``early`` (the first acknowledgements: the workers may still be starting) or
    ``later`` (many thousands of acknowledgements in, the workers long running)."""
    rng = random.Random(f"term:{kind}:{batch}:{when}:{seed}")
    root = tmp_path / "store"
    overrides = small_store_overrides(writer={"kind": kind})
    writer = FaultWriter(root, overrides, seed=seed, batch=batch,
                         then="close").start(timeout_s=WRITER_TIMEOUT_S)
    try:
        assert writer.read_until(rng.randint(20, 50) if when == "early"
                                 else rng.randint(8000, 16000))
        time.sleep(rng.uniform(0, 0.002))  # not a synchronisation: where in a put it lands
        writer.signal_group(signal.SIGTERM)
    finally:
        code = writer.finish()
    assert code == -signal.SIGTERM, writer.stderr.decode(errors="replace")[-4000:]
    assert writer.refusals == [] and writer.interrupted == 0
    summary, _records = check_store(root, overrides, writer, seed)
    print(f"\n{kind} {'put_batch' if batch else 'put'} {when} seed {seed}: SIGTERM after "
          f"{len(writer.acks)} acks; {summary}")


def test_closing_the_last_store_gives_the_handlers_back(tmp_path):
    """The store wraps SIGINT's handler while it is open (in this, the main thread) and gives
    the program's own back when it closes; a handler set after the open is wrapped at the next
    put and is the one given back. It starts from Python's own handler, as a program run from
    a terminal does (a runner started in the background may have SIGINT ignored, which the
    store keeps as it is)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    store = MessageStore.open(tmp_path / "s", load_config(overrides=small_store_overrides()))
    try:
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler

        def own(_signum, _frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, own)
        assert store.put(Message(TOPIC, b"x")).status is PutStatus.PUT_OK
        assert signal.getsignal(signal.SIGINT) is not own  # wrapped again by the put
    finally:
        store.close()
    try:
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_close_is_handled_once_the_store_is_closed(tmp_path):
    """A Ctrl-C landing while the workers are being stopped: the close completes (workers
    stopped, files released, clean-shutdown marker left, lock free) and the KeyboardInterrupt
    arrives after it, in the program's own handler."""
    root = tmp_path / "s"
    store = MessageStore.open(root, load_config(overrides=small_store_overrides()))
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def own(signum, _frame):
        seen.append(signum)
        raise KeyboardInterrupt("the program's own")
    signal.signal(signal.SIGINT, own)
    try:
        acks = [store.put(Message(TOPIC, b"m%d" % i, queue_id=0)) for i in range(50)]
        runtime = store._runtime
        stop = runtime.stop

        def stop_with_ctrl_c(last_end):
            os.kill(os.getpid(), signal.SIGINT)  # handled between bytecodes, inside the close
            time.sleep(0.05)
            return stop(last_end)
        runtime.stop = stop_with_ctrl_c
        with pytest.raises(KeyboardInterrupt, match="the program's own"):
            store.close()
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is own  # handed back by the finished close
        assert not (root / "abort").exists() and (root / "mqstore.clean").exists()
        again = MessageStore.open(root, load_config(overrides=small_store_overrides()))
        try:
            assert again.recovery_report.clean
            got = pulled_queue(again, 0)
            assert [m.phys_offset for m in got] == [a.phys_offset for a in acks]
        finally:
            again.close()
    finally:
        signal.signal(signal.SIGINT, before)


_FORKSERVER_MASK = """
import json, sys
from multiprocessing import forkserver
from mqstore import MessageStore, load_config
from mqstore.testing.faults import small_store_overrides

def blocked(pid):
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["SigBlk"], 16)

store = MessageStore.open(sys.argv[1], load_config(overrides=small_store_overrides()))
try:
    print(json.dumps({"forkserver": blocked(forkserver._forkserver._forkserver_pid),
                      "store": blocked("self")}))
finally:
    store.close()
"""


def test_workers_are_forked_with_ctrl_c_blocked_until_they_ignore_it(tmp_path):
    """A worker must not die of a Ctrl-C sent to the group while it starts, before it sets
    its own handling: the forkserver it is forked from runs with SIGINT blocked, also when
    the store's open is the first to start multiprocessing's resource tracker (in a fresh
    process, as here), which unblocks SIGINT in the thread that starts it."""
    script = tmp_path / "mask.py"
    script.write_text(_FORKSERVER_MASK)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    masks = json.loads(out.stdout.strip().splitlines()[-1])
    sigint = 1 << (signal.SIGINT - 1)
    assert masks["forkserver"] & sigint, masks
    assert not masks["store"] & sigint, masks  # the store's own thread is as it was
