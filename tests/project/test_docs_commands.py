"""Every shell command in README.md and docs/*.md runs as printed, in order, against the state
the commands before it set up.

The commands of each ```sh block are taken line by line (comment-only lines dropped) and run
with bash in a fresh directory per document, holding a copy of ``config/``, with ``mqstore``
on PATH as this interpreter's. ``make TARGET`` runs the target's recipe from the Makefile (its
prerequisite, installing the virtual environment, is what the test runs in already). The
commands that cannot run here are listed in ``NOT_RUN`` with the reason; a command of the docs
neither run nor listed, or a listed one the docs no longer have, fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paths import REPO
from cli_support import env

pytestmark = pytest.mark.usefixtures("no_plugin_env")
ROOT = REPO
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_TIMEOUT_S = 180

SPARK = "needs Spark and Java 17 (tests/spark/test_spark_export*.py run the export)"
SERVER = "needs the running server of the line before (tests/ops/test_cli_serve.py runs serve)"
RUNBOOK = ("operations.md's runbook acts on the machine (/etc, /opt, /var, systemd): "
           "tests/ops/test_runbook.py runs it with the paths under a temporary directory")
PROMTOOL = "needs promtool (make tools unpacks it): tests/ops/test_opskit.py runs it"
NOT_RUN = {
    ("README.md", "make run"): "the same as docs/quickstart.md's first command, run there, "
                               "where the next commands read the store it makes",
    ("README.md", "make test"): "runs the whole test suite, this test included",
    ("README.md", '.venv/bin/python -m pytest -m "not slow"'):
        "runs most of the test suite, this test included",
    ("README.md", "mqstore serve -c deploy.yaml"): "a server: runs until stopped "
                                                   "(tests/ops/test_cli_serve.py runs it)",
    ("README.md", "mqstore export events --to out"): SPARK,
    ("README.md", "mqstore produce --server 127.0.0.1:8081 -t logs hi"):
        "needs a serve with server.grpc_listen (tests/endpoint/ run produce --server)",
    ("quickstart.md", "make test"): "runs the whole test suite, this test included",
    ("quickstart.md", "mqstore serve -c deploy.yaml"): "a server: runs until stopped "
                                                       "(tests/ops/test_cli_serve.py runs it)",
    ("quickstart.md", "curl -s localhost:9108/healthz"): SERVER,
    ("quickstart.md", "curl -s localhost:9108/metrics | grep mqstore_queue_depth_messages"):
        SERVER,
    ("spark.md", "pip install 'mqstore[spark]'"): "installs packages from the network",
    ("endpoint.md", "pip install -e '.[grpc]'"): "installs packages (make test installs the "
                                                 "grpc extra)",
    ("endpoint.md", "mqstore serve -c deploy.yaml"): "a server: runs until stopped "
                                                     "(tests/endpoint/ run it)",
    ("spark.md", "mqstore export /data/broker-* --to /lake/export --topics orders,audit "
                 "--mode overwrite"): SPARK,
    ("spark.md", "python -m mqstore.spark.export /data/broker-* --to /lake/export --topics "
                 "orders,audit --mode overwrite"): SPARK,
    ("operations.md", "promtool check rules config/prometheus/mqstore-alerts.yml"): PROMTOOL,
    ("operations.md", "promtool test rules config/prometheus/mqstore-alerts.test.yml"): PROMTOOL,
    **{("operations.md", command): RUNBOOK for command in (
        "useradd --system --home-dir /var/lib/mqstore --shell /usr/sbin/nologin mqstore",
        "python3 -m venv /opt/mqstore",
        "/opt/mqstore/bin/pip install '.[grpc]'",
        "install -D -m 0644 config/systemd/mqstore.yaml /etc/mqstore/mqstore.yaml",
        "install -D -m 0644 config/systemd/mqstore.service /etc/systemd/system/mqstore.service",
        "systemctl daemon-reload",
        "systemctl enable --now mqstore",
        "curl -sf --retry 30 --retry-connrefused --retry-delay 1 localhost:9108/healthz",
        "/opt/mqstore/bin/mqstore produce --server localhost:8081 -t smoke deployed",
        "/opt/mqstore/bin/pip install --upgrade '.[grpc]'",
        "systemctl restart mqstore",
        "install -d -m 0700 /var/backups/mqstore",
        "systemctl stop mqstore",
        "tar -C /var/lib -czf /var/backups/mqstore/mqstore-$(date +%Y%m%d-%H%M%S).tar.gz mqstore",
        "systemctl start mqstore",
        "mv /var/lib/mqstore /var/lib/mqstore.replaced",
        'tar -C /var/lib -xzf "$(ls -t /var/backups/mqstore/*.tar.gz | head -n 1)"',
        "chown -R mqstore:mqstore /var/lib/mqstore",
        "/opt/mqstore/bin/mqstore check /var/lib/mqstore")},
}


def shell_commands(path: Path) -> list[str]:
    """The commands of the document's sh blocks, in order, without trailing comments."""
    blocks = re.findall(r"^```(?:sh|bash|shell|console)\n(.*?)^```$", path.read_text(),
                        flags=re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(_without_comment(line))
    return commands


def _without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a shell comment (outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def make_recipe(target: str) -> list[str]:
    """The recipe of ``make TARGET`` with the Makefile's variables put in (``$(BIN)/`` is
    PATH's)."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) *[?:]?= *(.*)$", text, flags=re.M))
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, flags=re.M)
    assert recipe, f"the Makefile has no target {target!r}"
    return [re.sub(r"\$\((\w+)\)", lambda m: variables[m[1]],
                   line.strip().replace("$(BIN)/", "")) for line in recipe[1].splitlines()]


def documented() -> list[tuple[str, str]]:
    return [(path.name, command) for path in DOCS for command in shell_commands(path)]


def test_every_command_not_run_is_listed_with_a_reason_and_is_still_in_the_docs():
    commands = set(documented())
    assert [key for key in NOT_RUN if key not in commands] == []
    assert all(reason for reason in NOT_RUN.values())


@pytest.mark.parametrize("doc", [p for p in DOCS if any((p.name, c) not in NOT_RUN
                                                         for c in shell_commands(p))],
                         ids=lambda p: p.name)
def test_doc_commands_run_as_printed(doc, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "config", work / "config")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "mqstore"  # this checkout's command, on this interpreter
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m mqstore.cli \"$@\"\n")
    shim.chmod(0o755)
    run_env = {**env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "TMPDIR": str(tmp_path)}
    for command in shell_commands(doc):
        if (doc.name, command) in NOT_RUN:
            continue
        make = re.fullmatch(r"make (\w+)", command)
        for line in make_recipe(make[1]) if make else [command]:
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=work,
                                  capture_output=True, text=True, env=run_env,
                                  timeout=COMMAND_TIMEOUT_S)
            assert proc.returncode == 0, (f"{doc.name}: `{command}` ({line}) exited "
                                          f"{proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                          f"{proc.stderr[-3000:]}")
            assert "Traceback" not in proc.stderr, proc.stderr
