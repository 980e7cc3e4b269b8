"""RocketMQ's C++ client (PyPI ``rocketmq==0.4.4``: a binding whose wheel bundles
``librocketmq.so``, speaking the remoting protocol), installed into a directory of its own
inside the virtualenv: its module is named ``rocketmq`` as the gRPC client's is, so it runs in
subprocesses with that directory first on their path. Used by tests/remoting and
benchmarks/bench_remoting.py."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

CPP_CLIENT = "rocketmq==0.4.4"
CPP_DIR = Path(sys.prefix) / "mqstore-test-cache" / "rocketmq-cpp-0.4.4"
INSTALL_TIMEOUT_S = 600


def install_cpp_client() -> Path:
    """The directory holding the client's package; installed with this interpreter's pip the
    first time (about 2 s from pip's cache; a file lock keeps parallel workers to one
    install)."""
    CPP_DIR.parent.mkdir(parents=True, exist_ok=True)
    done = CPP_DIR / ".installed"
    with open(CPP_DIR.parent / "rocketmq-cpp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                            str(CPP_DIR), "--no-deps", "--upgrade", CPP_CLIENT], check=True,
                           timeout=INSTALL_TIMEOUT_S)
            done.touch()
    return CPP_DIR


def cpp_env(client_dir: Path, home: Path | str) -> dict:
    """A subprocess environment whose ``rocketmq`` is the C++ client."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(client_dir)
    env["HOME"] = str(home)  # the client writes its logs under ~/logs
    return env
