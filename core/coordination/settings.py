"""Coordination's settings in seconds (from the ``coordination`` config section), and its clock.

NOTE [ The fencing clock ]
A leader may write only until its own deadline: the time it SENT the last keepalive etcd
answered, plus the lease's TTL, minus ``safety_margin``. etcd counts the TTL from when the
keepalive arrived, later than it was sent, and may expire a lease late (a new etcd leader
renews every lease to its full TTL) but never early; so the holder's deadline always falls
before the moment any other node can take the key. The margin covers clock-rate differences
between the machines and a put that passed the check just before the deadline.

The clock is CLOCK_BOOTTIME: monotonic, and it counts time the machine spent suspended, which
CLOCK_MONOTONIC does not (a laptop-style suspend must not leave a holder believing its lease
still runs). It also counts time the process spent stopped: a holder SIGSTOPped past its
deadline reads a passed deadline on its first check after SIGCONT, whatever its threads did
or did not do meanwhile. ``may_write`` is that comparison and nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now() -> float:
    """Seconds on the fencing clock (see NOTE [ The fencing clock ])."""
    return time.clock_gettime(_CLOCK)


@dataclass(frozen=True)
class CoordinationSettings:
    endpoints: tuple[str, ...]
    cluster: str
    node: str
    ttl_s: int
    renew_s: float
    retry_s: float
    margin_s: float
    priority: int = 1
    max_lag_bytes: int = 0

    @classmethod
    def of(cls, section) -> "CoordinationSettings":
        """From ``StoreConfig.coordination`` (validated there)."""
        return cls(tuple(section.etcd_endpoints), section.cluster, section.node,
                   section.lease_ttl_s, section.renew_interval_ms / 1000.0,
                   section.retry_timeout_ms / 1000.0, section.safety_margin_ms / 1000.0,
                   section.priority, section.max_lag_bytes)


__all__ = ["CoordinationSettings", "now"]
