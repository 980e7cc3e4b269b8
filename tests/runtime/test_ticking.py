"""The ticking thread of the schedule and of the transaction checker (``runtime.ticking``): it
ticks on a master only, ticks again at once when a tick left work, and logs a failed tick and
waits the retry interval before the next."""

from __future__ import annotations

import logging

from mqstore.errors import CorruptStateError
from mqstore.runtime.ticking import MasterTicker
from mqstore.testing import wait_for

HOUR_S = 3600.0  # a wait no test outlasts: where the contract says none, it would show
LOG = logging.getLogger("tests.ticking")


class _Role:
    def __init__(self, refusal: str | None = None) -> None:
        self.why = refusal

    def refusal(self) -> str | None:
        return self.why


def _ticker(tick, role, on_slave=lambda: None, *, tick_s=HOUR_S, retry_s=HOUR_S):
    return MasterTicker("test-ticker", tick, role=role, on_slave=on_slave, log=LOG,
                        what="ticking of /store", tick_s=tick_s, retry_s=retry_s)


def test_a_tick_that_left_work_is_followed_at_once():
    ticks: list = []

    def tick() -> bool:
        ticks.append(1)
        return len(ticks) < 3  # work left twice, then the tick interval (an hour)

    ticker = _ticker(tick, _Role())
    ticker.start()
    try:
        wait_for(lambda: len(ticks) == 3, what="three ticks, the first two without a wait")
    finally:
        ticker.stop()  # within the hour's wait: a stop ends it
    assert len(ticks) == 3


def test_on_a_slave_it_does_not_tick_until_it_is_a_master():
    role = _Role("a slave")
    ticks: list = []
    slave_rounds: list = []
    ticker = _ticker(lambda: ticks.append(1), role, lambda: slave_rounds.append(1),
                     tick_s=0.01)
    ticker.start()
    try:
        wait_for(lambda: len(slave_rounds) >= 3, what="rounds as a slave")
        assert ticks == []
        role.why = None
        wait_for(lambda: ticks, what="a tick once a master")
    finally:
        ticker.stop()


def test_a_failed_tick_is_logged_and_the_next_waits_the_retry_interval(caplog):
    failures = iter([CorruptStateError("delayOffset.json: not JSON"), RuntimeError("boom")])
    ticks: list = []

    def tick() -> None:
        ticks.append(1)
        failure = next(failures, None)
        if failure is not None:
            raise failure

    # The tick interval is an hour: three ticks mean both failures waited the retry interval.
    ticker = _ticker(tick, _Role(), retry_s=0.01)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        ticker.start()
        try:
            wait_for(lambda: len(ticks) == 3, what="two failed ticks and a third")
        finally:
            ticker.stop()
    records = [(r.levelname, r.getMessage(), r.exc_info is not None and r.exc_info[0])
               for r in caplog.records if r.name == LOG.name]
    assert records == [
        ("ERROR", "ticking of /store: delayOffset.json: not JSON", False),
        ("ERROR", "ticking of /store: a tick failed; trying again", RuntimeError),
    ]
    assert len(ticks) == 3
