"""What SIGHUP changes in a running ``mqstore serve``: the configuration file read again, and
the keys that can change without a restart taken from it.

``RELOADED`` keys take effect at once: the log level (serve's own lines; a worker process
takes it when it next starts), the HTTP server's bounds (connections, idle and request time,
header bytes: for connections accepted from then on), and the gRPC endpoint's access keys and
connection cap (for calls from then on). Every other key that differs between the running
configuration and the file is reported as needing a restart and left as it runs; the running
configuration keeps its old value, so the next SIGHUP reports it again. A file that does not
load changes nothing.

Values of ``SECRET`` keys are never shown: an access-key list is shown as its access keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mqstore.config import StoreConfig

RELOADED = ("server.log_level", "server.max_connections", "server.idle_timeout_ms",
            "server.request_timeout_ms", "server.max_header_bytes",
            "server.grpc_access_keys", "server.grpc_max_connections")
SECRET = ("server.grpc_access_keys", "server.grpc_admin_keys")


@dataclass(frozen=True)
class Change:
    key: str  # "section.key"
    old: Any
    new: Any

    @property
    def reloaded(self) -> bool:
        return self.key in RELOADED

    def show(self) -> str:
        return f"{self.key}: {_shown(self.key, self.old)} -> {_shown(self.key, self.new)}"


def _shown(key: str, value: Any) -> str:
    if key in SECRET:
        names = [pair.partition(":")[0] for pair in value]
        return f"access keys [{', '.join(names)}]" if names else "no access keys"
    return repr(value)


def _flat(config: StoreConfig) -> dict[str, Any]:
    return {f"{section}.{key}": value
            for section, values in config.model_dump().items()
            for key, value in values.items()}


def changes(running: StoreConfig, wanted: StoreConfig) -> list[Change]:
    """Every key whose value differs, in the configuration's order."""
    before, after = _flat(running), _flat(wanted)
    return [Change(key, before[key], after[key]) for key in before
            if before[key] != after[key]]


def applied(running: StoreConfig, reloaded: list[Change]) -> StoreConfig:
    """``running`` with the reloaded changes in place (the others stay as they run)."""
    overrides: dict[str, dict[str, Any]] = {}
    for change in reloaded:
        section, key = change.key.split(".", 1)
        overrides.setdefault(section, {})[key] = change.new
    return running.replace(**overrides) if overrides else running


__all__ = ["Change", "RELOADED", "changes", "applied"]
