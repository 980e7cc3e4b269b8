"""Running the ``mqstore`` command as a subprocess, as an operator or a script would."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

# Small files: a default-config store has 1 GiB segments and 420 MB index files (sparse).
SMALL_CONFIG = """\
commit_log: {segment_bytes: 65536}
consume_queue: {file_units: 100}
index: {max_hash_slots: 64, max_index_entries: 256}
plugins: {load_entry_points: false}
"""
CLI_TIMEOUT_S = 60


def env() -> dict:
    out = {k: v for k, v in os.environ.items()
           if k not in ("MQSTORE_LOAD_PLUGINS", "MQSTORE_DISABLE_PLUGINS",
                        "MQSTORE_TRACE_PLUGINS")}
    out["PYTHONWARNINGS"] = "ignore"
    return out


def mqstore(*args, input: str | None = None, check: int | None = 0) -> subprocess.CompletedProcess:
    """Run ``mqstore ARGS``; ``check``: the exit status expected (None: any)."""
    from mqstore.testing import patience  # here: the client processes import this module

    proc = subprocess.run([sys.executable, "-m", "mqstore.cli", *map(str, args)], input=input,
                          capture_output=True, text=True, env=env(),
                          timeout=patience(CLI_TIMEOUT_S))
    if check is not None:
        assert proc.returncode == check, (f"mqstore {' '.join(map(str, args))} exited "
                                          f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def mqstore_tty(*args, columns: int = 80) -> tuple[int, str]:
    """Run ``mqstore ARGS`` with standard output and error on a terminal ``columns`` wide (a
    pseudo-terminal), as a person at a shell would; returns the exit status and what the
    terminal was sent, colours and cursor movements removed (lines end in \\r\\n)."""
    from mqstore.testing import patience

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "mqstore.cli", *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**env(), "COLUMNS": str(columns), "LINES": "50",
                                 "TERM": "xterm"})
    os.close(slave)
    sent = []
    deadline = time.monotonic() + patience(CLI_TIMEOUT_S)
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                proc.kill()
                raise AssertionError(f"mqstore {' '.join(map(str, args))} ran over "
                                     f"{CLI_TIMEOUT_S} s")
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every holder of the terminal's other end has exited
                break
            if not data:
                break
            sent.append(data)
    finally:
        os.close(master)
    status = proc.wait(timeout=CLI_TIMEOUT_S)
    return status, ANSI_CODE.sub("", b"".join(sent).decode("utf-8", errors="replace"))


def mqstore_json(*args, check: int | None = 0, input: str | None = None):
    return json.loads(mqstore(*args, "--json", check=check, input=input).stdout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``Error: ...`` line a failed command printed."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]
