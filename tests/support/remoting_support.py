"""``mqstore serve`` with its remoting server in a subprocess, and a frame-level client that
speaks RocketMQ's remoting protocol to it (as ``RemotingCommand`` frames on a socket)."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mqstore.format import remoting_frame as rf
from mqstore.message import StoredMessage

from cli_support import SMALL_CONFIG, env

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
CALL_TIMEOUT_S = 30


def deployment_yaml(path: Path, root: Path, server: dict | None = None, extra: str = "",
                    small: bool = True) -> Path:
    settings = {"metrics_listen": "127.0.0.1:0", "remoting_listen": "127.0.0.1:0",
                **(server or {})}
    path.write_text((SMALL_CONFIG if small else "plugins: {load_entry_points: false}\n")
                    + extra + f"store: {{root: {json.dumps(str(root))}}}\n"
                    f"server: {json.dumps(settings)}\n")
    return path


class Served:
    """A running ``mqstore serve``; ``address`` is "127.0.0.1:PORT" of its remoting port.
    ``nofile``: its RLIMIT_NOFILE (its workers inherit it)."""

    def __init__(self, yaml: Path, log_path: Path, home: Path | None = None,
                 nofile: int | None = None) -> None:
        self.log_path = log_path
        log = open(log_path, "w")
        extra = {"HOME": str(home)} if home is not None else {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore.cli", "serve", "-c", str(yaml)],
            stdout=log, stderr=subprocess.STDOUT, env={**env(), **extra},
            start_new_session=True, preexec_fn=None if nofile is None else
            (lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                        (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))))
        log.close()
        self.address = self.wait_for(r"serving RocketMQ remoting on ([\d.]+:\d+)")

    def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in serve's log:\n{self.log()}")

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, signum=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)
        return self.proc.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT_S)


class Wire:
    """One connection speaking remoting frames; responses matched by opaque (a held pull's
    answer may come after later ones)."""

    def __init__(self, address: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._opaque = 0
        self._buf = b""
        self.unmatched: list[rf.Command] = []  # frames read while waiting for another

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Wire":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, code: int, ext: dict | None = None, body: bytes | None = None, *,
                serialize: int = rf.JSON, oneway: bool = False, language: str = "JAVA",
                version: int = 409) -> int:
        """Send one request; its opaque."""
        self._opaque += 1
        cmd = rf.Command(code, opaque=self._opaque, flag=rf.ONEWAY_FLAG if oneway else 0,
                         ext={k: str(v) for k, v in (ext or {}).items()}, body=body,
                         serialize_type=serialize, language=language, version=version)
        self.sock.sendall(rf.encode(cmd))
        return self._opaque

    def read(self) -> rf.Command:
        """The next frame from the server (None-free: raises on EOF)."""
        while True:
            if len(self._buf) >= 4:
                length = int.from_bytes(self._buf[:4], "big")
                if len(self._buf) >= 4 + length:
                    frame, self._buf = self._buf[4:4 + length], self._buf[4 + length:]
                    return rf.decode(frame)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("the server closed the connection")
            self._buf += chunk

    def response(self, opaque: int) -> rf.Command:
        for i, cmd in enumerate(self.unmatched):
            if cmd.is_response and cmd.opaque == opaque:
                return self.unmatched.pop(i)
        while True:
            cmd = self.read()
            if cmd.is_response and cmd.opaque == opaque:
                return cmd
            self.unmatched.append(cmd)

    def call(self, code: int, ext: dict | None = None, body: bytes | None = None,
             **kwargs) -> rf.Command:
        return self.response(self.request(code, ext, body, **kwargs))


def send_ext(topic: str, queue_id: int = 0, properties: str = "", **more) -> dict:
    """A SEND_MESSAGE header as the C++ client fills it."""
    return {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": properties,
            "reconsumeTimes": 0, "unitMode": "false", "batch": "false", **more}


def pull_ext(group: str, topic: str, queue_id: int, offset: int, *, max_msgs: int = 32,
             sysflag: int = 4, suspend_ms: int = 0, subscription: str = "*", **more) -> dict:
    return {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_msgs, "sysFlag": sysflag, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_ms, "subscription": subscription,
            "subVersion": 0, "expressionType": "TAG", **more}


def props(**values: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in values.items())


def records(body: bytes) -> list[StoredMessage]:
    """The stored records of a pull's or query's body."""
    out, at = [], 0
    while at < len(body):
        size = int.from_bytes(body[at:at + 4], "big")
        out.append(StoredMessage.from_bytes(body[at:at + size]))
        at += size
    return out
