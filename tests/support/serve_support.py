"""``mqstore serve`` as the tests run it: in its own process group, its URL read from its log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from cli_support import env
from mqstore.testing import patience

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30


def start(yaml, log_path, **popen):
    """``mqstore serve`` in its own process group (``popen``: more Popen arguments); returns
    the process and the base URL it logged."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "mqstore.cli", "serve", "-c", str(yaml)],
                            stdout=log, stderr=subprocess.STDOUT, env=env(),
                            start_new_session=True, **popen)
    log.close()
    deadline = time.monotonic() + patience(START_TIMEOUT_S)
    while time.monotonic() < deadline:
        found = re.search(r"serving metrics on (http://[\d.:]+)/metrics", log_path.read_text())
        if found:
            return proc, found.group(1)
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"serve did not start:\n{log_path.read_text()}")


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
