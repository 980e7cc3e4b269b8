"""``systemctl`` for the runbook test (tests/ops/test_runbook.py): what systemd does with the
unit ``$RUNBOOK_ROOT/etc/systemd/system/NAME.service`` for the verbs the runbook uses, on a
real process.

    daemon-reload      reads every unit (a unit that does not parse fails)
    start, enable --now
                       runs ExecStart in a session of its own (Type=exec: back once it runs),
                       stdout and stderr appended to $RUNBOOK_ROOT/journal/NAME.log
    stop               KillSignal to the main process (KillMode=mixed), waits TimeoutStopSec;
                       fails unless serve logged a clean close (stricter than systemd)
    reload             ExecReload with $MAINPID put in
    restart            stop, then start
"""

from __future__ import annotations

import configparser
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["RUNBOOK_ROOT"])
UNITS = ROOT / "etc" / "systemd" / "system"
RUN = ROOT / "run"


def unit(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read_string((UNITS / f"{name}.service").read_text())
    return parser["Service"]


def main_pid(name: str) -> int | None:
    path = RUN / f"{name}.pid"
    if not path.exists():
        return None
    pid = int(path.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def start(name: str) -> int:
    if main_pid(name) is not None:
        return 0
    service = unit(name)
    RUN.mkdir(exist_ok=True)
    (ROOT / "journal").mkdir(exist_ok=True)
    with open(ROOT / "journal" / f"{name}.log", "a") as journal:
        proc = subprocess.Popen(shlex.split(service["ExecStart"]), stdout=journal,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    return 0


def stop(name: str) -> int:
    pid = main_pid(name)
    if pid is None:
        return 0
    service = unit(name)
    os.kill(pid, getattr(signal, service["KillSignal"]))
    deadline = time.monotonic() + float(service["TimeoutStopSec"])
    while _alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            print(f"{name}.service: stop timed out; killed", file=sys.stderr)
            return 1
        time.sleep(0.05)
    (RUN / f"{name}.pid").unlink()
    if not _closed_cleanly(name):
        print(f"{name}.service: the store did not close cleanly", file=sys.stderr)
        return 1
    return 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _closed_cleanly(name: str) -> bool:
    """serve's verdict on its close, from its journal: the process is not this one's child,
    so its exit status is not to be had."""
    journal = (ROOT / "journal" / f"{name}.log").read_text()
    last = journal.rsplit("store closed", 1)
    return len(last) == 2 and last[1].startswith(" cleanly")


def reload(name: str) -> int:
    pid = main_pid(name)
    if pid is None:
        print(f"{name}.service is not active, cannot reload", file=sys.stderr)
        return 1
    command = unit(name)["ExecReload"].replace("$MAINPID", str(pid))
    return subprocess.run(shlex.split(command)).returncode


def main(argv: list[str]) -> int:
    verb, names = argv[0], [a for a in argv[1:] if not a.startswith("-")]
    if verb == "daemon-reload":
        for path in UNITS.glob("*.service"):
            unit(path.stem)
        return 0
    for name in names:
        name = name.removesuffix(".service")
        if verb == "enable" and "--now" in argv or verb == "start":
            code = start(name)
        elif verb == "stop":
            code = stop(name)
        elif verb == "restart":
            code = stop(name) or start(name)
        elif verb == "reload":
            code = reload(name)
        else:
            print(f"systemctl shim: {verb} is not one the runbook uses", file=sys.stderr)
            return 2
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
