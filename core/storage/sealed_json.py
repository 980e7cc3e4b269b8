"""Small JSON files of mqstore's own that a crash or a stray edit must not make lie: one
object, keys sorted, compact, with ``crc32`` (zlib) of the object without that key.

Written durably: a temporary file fsynced, renamed over the old one, then the directory
fsynced, so after a crash the file is the old one or the new one, never a mix.
"""

from __future__ import annotations

import json
import zlib

from mqstore import _moved
from mqstore.storage.durable_file import replace_file


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def seal(body: dict) -> bytes:
    return _canonical({**body, "crc32": zlib.crc32(_canonical(body))})


def unseal(data: bytes) -> tuple[dict | None, str | None]:
    """The object without its CRC, or None and why it cannot be trusted."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"it is garbled ({exc})"
    if not isinstance(obj, dict) or not isinstance(obj.get("crc32"), int):
        return None, "it is garbled (no CRC)"
    body = {k: v for k, v in obj.items() if k != "crc32"}
    if zlib.crc32(_canonical(body)) != obj["crc32"]:
        return None, "it is garbled (CRC mismatch)"
    return body, None


def read_sealed(path: str) -> tuple[dict | None, str | None]:
    """The object a sealed file holds, or None and why it cannot be used (None, None: there
    is no such file)."""
    try:
        with open(path, "rb") as f:
            body, problem = unseal(f.read())
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read ({exc})"
    return (body, None) if body is not None else (None, f"{path}: {problem}")


def write_sealed(path: str, body: dict) -> None:
    replace_file(path, seal(body), fsync=True, sync_directory=True)


def __getattr__(name: str) -> object:
    return _moved.moved_attribute(__name__, name)  # sync_dir: storage.durable_file
