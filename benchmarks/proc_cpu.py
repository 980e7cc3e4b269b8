"""The CPU a server and the processes under it spent, from /proc (Linux): for the benchmarks
that compare servers by CPU per message (``bench_endpoint``, ``bench_remoting``).

Standard library only: ``bench_remoting``'s client side runs with the C++ client's directory
first on sys.path and imports nothing of mqstore.
"""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (OSError once it is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (serve's workers are children of its forkserver)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        out += frontier
    return out


def descendants_cpu_s(pid: int) -> float:
    """CPU seconds of every process under ``pid`` so far (one gone meanwhile counts none)."""
    total = 0.0
    for child in descendants(pid):
        try:
            total += cpu_s(child)
        except OSError:
            pass
    return total
