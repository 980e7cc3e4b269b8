"""How long the dispatch worker naps after a pass that caught up: long enough that a trickle of
puts shares each pass's fixed costs, never so long that a record waits more than
``NAP_MOST_S`` beyond ``dispatch.interval_ms`` to become visible."""

from __future__ import annotations

import pytest

from mqstore.runtime.workers.dispatch_worker import NAP_MOST_S, NAP_PER_PASS, nap_after_pass


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
