"""docs/operations.md's runbook, run as printed: install, deploy, reload, upgrade, back up,
restore, with a real ``mqstore serve`` under the shipped unit and deployment.

Its absolute paths (``/opt/mqstore``, ``/etc/mqstore``, ``/etc/systemd/system``,
``/var/lib``, ``/var/backups``) are put under a temporary directory, its ports (9108, 8081)
are free ports of 127.0.0.1, in the commands and in the copy of ``config/`` they install
from; ``systemctl`` is ``tests/support/systemctl_shim.py``, which starts and signals serve as
the unit says. The commands that change the machine or fetch packages are in ``NOT_RUN``
with the reason; ``/opt/mqstore/bin/mqstore`` is this checkout's command.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore import MessageStore, load_config
from cli_support import env
from paths import REPO

pytestmark = [pytest.mark.usefixtures("no_plugin_env"), pytest.mark.slow]
SUPPORT = Path(__file__).resolve().parents[1] / "support"
COMMAND_TIMEOUT_S = 180
PATHS = ("/opt/mqstore", "/etc/mqstore", "/etc/systemd/system", "/var/lib", "/var/backups")
NOT_RUN = {
    "useradd --system --home-dir /var/lib/mqstore --shell /usr/sbin/nologin mqstore":
        "adds a user to the machine",
    "python3 -m venv /opt/mqstore": "the test's /opt/mqstore/bin/mqstore is this checkout's",
    "/opt/mqstore/bin/pip install '.[grpc]'": "installs packages (make test installed them)",
    "/opt/mqstore/bin/pip install --upgrade '.[grpc]'": "installs packages",
    "chown -R mqstore:mqstore /var/lib/mqstore": "needs the mqstore user",
}


def runbook_blocks() -> list[list[str]]:
    """The commands of each sh block of the runbook."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("\n## Runbook\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.M | re.S)
    return [[line for line in block.splitlines()
             if line.strip() and not line.lstrip().startswith("#")] for block in blocks]


def runbook_commands() -> list[str]:
    return [command for block in runbook_blocks() for command in block]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def localized(text: str, root: Path, ports: dict[str, str]) -> str:
    for path in PATHS:
        text = text.replace(path, f"{root}{path}")
    for port, free in ports.items():
        text = text.replace(port, free)
    return text.replace("0.0.0.0", "127.0.0.1")


def test_every_not_run_command_is_in_the_runbook():
    assert sorted(set(NOT_RUN) - set(runbook_commands())) == []


def test_the_runbook_runs_as_printed(tmp_path):
    root = tmp_path / "machine"
    ports = {"9108": str(free_port()), "8081": str(free_port())}
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "config", work / "config")
    for path in (work / "config" / "systemd").iterdir():
        path.write_text(localized(path.read_text(), root, ports))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "systemctl"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {SUPPORT / 'systemctl_shim.py'} \"$@\"\n")
    venv_bin = root / "opt" / "mqstore" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "mqstore").write_text(f"#!/bin/sh\nexec {sys.executable} -m mqstore.cli \"$@\"\n")
    for script in (shim, venv_bin / "mqstore"):
        script.chmod(0o755)
    for path in ("var/lib", "var/backups", "etc/systemd/system"):
        (root / path).mkdir(parents=True, exist_ok=True)
    run_env = {**env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "RUNBOOK_ROOT": str(root), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    journal = root / "journal" / "mqstore.log"
    store = root / "var" / "lib" / "mqstore"
    def run(command: str) -> None:
        line = localized(command, root, ports)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=work, env=run_env,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}:\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-2000:]}\n{journal.read_text()[-4000:] if journal.exists() else ''}")

    *blocks, restore = runbook_blocks()
    try:
        for command in [c for block in blocks for c in block if c not in NOT_RUN]:
            run(command)
        # Not in the runbook: a message stored after the backup, so that the restored store
        # can be told from the one it replaces.
        run("curl -sf --retry 30 --retry-connrefused --retry-delay 1 localhost:9108/healthz")
        run("/opt/mqstore/bin/mqstore produce --server localhost:8081 -t smoke "
            "'after the backup'")
        for command in [c for c in restore if c not in NOT_RUN]:
            run(command)
    finally:
        subprocess.run([str(shim), "stop", "mqstore"], env=run_env, timeout=COMMAND_TIMEOUT_S)
        pid_file = root / "run" / "mqstore.pid"
        if pid_file.exists():
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    log = journal.read_text()
    # Every stop (backup, upgrade's restart, restore, the end) closed the store cleanly.
    assert log.count("store closed cleanly") == 4 and "not cleanly" not in log, log
    assert "Traceback" not in log
    # The restored store is the backup's: the deployment's smoke message, not the one stored
    # after the backup, which the directory put aside keeps.
    assert _bodies(store) == [b"deployed"]
    assert sorted(_bodies(root / "var" / "lib" / "mqstore.replaced")) == [
        b"after the backup", b"deployed"]


def _bodies(root: Path) -> list[bytes]:
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    with MessageStore.open(root, config=config, read_only=True) as store:
        return [m.body for q in store.queue_ids("smoke")
                for m in store.get("runbook", "smoke", q, 0, 100).messages]
