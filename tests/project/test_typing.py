"""The public surface type-checks: ``mqstore`` (the package face and ``MessageStore``),
``mqstore.plugin_api`` and the built-in plugins written against it.

mypy cannot follow the editable install's import hook (``mqstore`` lives in core/), so the test
stages core/ and plugins/ as one ``mqstore`` tree, as tests/project/test_architecture.py does, and runs
mypy there with the ``[tool.mypy]`` settings of pyproject.toml.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_architecture import PYPROJECT, _stage

TARGETS = ["-m", "mqstore", "-p", "mqstore.store", "-p", "mqstore.plugin_api",
           "-p", "mqstore.plugins"]


def _mypy(cwd, targets: list[str] = TARGETS) -> subprocess.CompletedProcess:
    env = {**os.environ, "MYPYPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT),
         "--cache-dir", str(cwd / ".mypy_cache"), *targets],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_public_surface_type_checks_and_a_type_error_is_caught(tmp_path):
    pkg = _stage(tmp_path)
    proc = _mypy(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
    # The same run catches a plugin misusing the plugin API (incremental: only this is redone).
    with (pkg / "plugins" / "writer_mmap.py").open("a") as f:
        f.write("\n\ndef _probe(store: StoreView) -> int:\n    return store.root\n")
    text = (pkg / "plugins" / "writer_mmap.py").read_text()
    (pkg / "plugins" / "writer_mmap.py").write_text(
        text.replace("from mqstore.plugin_api import", "from mqstore.plugin_api import StoreView,", 1))
    proc = _mypy(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "writer_mmap.py" in proc.stdout, proc.stdout
    assert 'Incompatible return value type (got "str", expected "int")' in proc.stdout, proc.stdout


# What a caller of the facade sees: a real type for every call and property, never Any.
CALLER = """\
from mqstore import Message, MessageStore

def caller(store: MessageStore) -> None:
    reveal_type(store.put(Message("T", b"x")))
    reveal_type(store.put_batch([Message("T", b"x")]))
    reveal_type(store.consume_queue("T", 0))
    reveal_type(store.consume_queues)
    reveal_type(store.subscriptions)
    reveal_type(store.ack(["h"]))
    reveal_type(store.internals.flush_client)
    reveal_type(store.internals.writer)
    reveal_type(store.internals.supervisor)
    reveal_type(store.internals.channels)
    reveal_type(store.commit_log)
"""
REVEALED = [
    "fallback=mqstore.message.PutResult]",  # a NamedTuple
    "mqstore.message.BatchPutResult",
    "mqstore.storage.consume_queue.ConsumeQueue | None",
    "dict[tuple[str, int], mqstore.storage.consume_queue.ConsumeQueue]",
    "mqstore.view.subscriptions.Subscriptions",
    "list[mqstore.consumer.errors.ReceiptHandleError | None]",  # the list overload
    "mqstore.runtime.workers.flush_client.FlushClient | None",
    "mqstore.plugin_api.contracts.Writer | None",
    "mqstore.runtime.workers.supervisor.DispatchSupervisor | None",
    "mqstore.runtime.workers.shm.Channels | None",
    "mqstore.storage.commit_log.CommitLog",  # the deprecated name, typed as the new one
]


def test_callers_of_the_facade_get_types_not_any(tmp_path):
    _stage(tmp_path)
    (tmp_path / "caller_probe.py").write_text(CALLER)
    proc = _mypy(tmp_path, ["caller_probe.py"])
    revealed = [line.split('Revealed type is "', 1)[1].rstrip('"')
                for line in proc.stdout.splitlines() if "Revealed type is" in line]
    assert len(revealed) == len(REVEALED), proc.stdout
    for got, expected in zip(revealed, REVEALED):
        assert got.endswith(expected) and "Any" not in got, (got, expected)
