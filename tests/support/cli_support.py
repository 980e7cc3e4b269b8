"""Running the ``mqstore`` command as a subprocess, as an operator or a script would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    proc = subprocess.run([sys.executable, "-m", "mqstore.cli", *map(str, args)], input=input,
                          capture_output=True, text=True, env=env(), timeout=CLI_TIMEOUT_S)
    if check is not None:
        assert proc.returncode == check, (f"mqstore {' '.join(map(str, args))} exited "
                                          f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def mqstore_json(*args, check: int | None = 0, input: str | None = None):
    return json.loads(mqstore(*args, "--json", check=check, input=input).stdout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``Error: ...`` line a failed command printed."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]
