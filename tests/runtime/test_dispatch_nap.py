"""How long the dispatch worker naps after a pass that caught up: long enough that a trickle of
puts shares each pass's fixed costs, never so long that a record waits more than
``NAP_MOST_S`` beyond ``dispatch.interval_ms`` to become visible."""

from __future__ import annotations

import os
import sys

import pytest

from mqstore import Message, PutStatus
from mqstore.runtime.workers.dispatch_worker import NAP_MOST_S, NAP_PER_PASS, nap_after_pass
from mqstore.testing import wait_for


@pytest.mark.parametrize("spent_s, interval_s, nap_s", [
    (0.0, 0.001, 0.001),  # a pass too cheap to measure: the configured interval
    (0.00002, 0.001, 0.001),  # cheap passes nap the interval, as before
    (0.0002, 0.001, 0.0002 * NAP_PER_PASS),  # a usual one-record pass: 3.8 ms
    (0.005, 0.001, NAP_MOST_S),  # a slow pass (a loaded machine): capped
    (0.0002, 0.05, 0.05),  # a configured interval above the cap still holds
])
def test_the_nap_after_a_pass(spent_s, interval_s, nap_s):
    assert nap_after_pass(spent_s, interval_s) == pytest.approx(nap_s)


def test_fixed_costs_take_at_most_a_twentieth_of_a_cpu():
    # a pass of c seconds then a nap of at least 19 c: at most c / 20 c of the time is spent
    for spent_s in (0.0001, 0.0003, 0.0005):
        nap = nap_after_pass(spent_s, 0.001)
        assert spent_s / (spent_s + nap) <= 1 / 20 + 1e-9
    assert NAP_MOST_S <= 0.01


HOLDING_PLUGIN = '''
import os, time
from mqstore import hookimpl

@hookimpl
def after_dispatch(batch):
    """Record each pass (its records, when it began and ended); hold the first until told."""
    began = time.monotonic()
    if int(batch.phys_offsets[0]) == 0:
        open(os.path.join({dir!r}, "holding"), "w").close()
        deadline = began + 60
        while not os.path.exists(os.path.join({dir!r}, "go")) and time.monotonic() < deadline:
            time.sleep(0.005)
    with open(os.path.join({dir!r}, "passes"), "a") as f:
        f.write(f"{{len(batch)}} {{began}} {{time.monotonic()}}\\n")
'''


def test_records_put_during_a_pass_wait_for_the_nap(make_store, tmp_path, monkeypatch):
    # A stream of single puts lands a record during nearly every pass: the worker that went on
    # at once after such a pass dispatched them one or two a pass, each with its fixed costs.
    plugin_dir = tmp_path / "plug"
    plugin_dir.mkdir()
    (plugin_dir / "pass_holder_plugin.py").write_text(HOLDING_PLUGIN.format(dir=str(tmp_path)))
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin_dir),
                                                                   os.environ.get("PYTHONPATH")])))
    interval_s = 3.0
    store = make_store({"dispatch": {"interval_ms": int(interval_s * 1000)},
                        "plugins": {"modules": ["pass_holder_plugin"]}})
    try:
        assert store.put(Message(topic="T", body=b"first", queue_id=0)).status is PutStatus.PUT_OK
        wait_for(lambda: (tmp_path / "holding").exists(), what="the first pass")
        for body in (b"second", b"third"):  # while the first pass runs
            assert store.put(Message(topic="T", body=body, queue_id=0)).status is PutStatus.PUT_OK
        (tmp_path / "go").touch()
        store.wait_dispatched()
        passes = [line.split() for line in (tmp_path / "passes").read_text().splitlines()]
        assert [int(n) for n, _began, _ended in passes] == [1, 2]
        # time.sleep never returns early: the second pass began a whole nap after the first
        assert float(passes[1][1]) - float(passes[0][2]) >= interval_s
        assert [m.body for m in store.get("g", "T", 0, 0, 32).messages] == [
            b"first", b"second", b"third"]
    finally:
        store.close()
        sys.modules.pop("pass_holder_plugin", None)
