"""The ``server`` keys of RocketMQ 4.x's broker port (docs/remoting.md): the remoting server
``mqstore serve`` runs with ``server.remoting_listen``, and the NameServers it registers with.
``config.server.ServerSection`` inherits them; loading checks them as every key is checked."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from mqstore.config.values import JAVA_INT_MAX, parse_listen
from mqstore.format.hosts import parse_host

_NAME = r"^[a-zA-Z0-9_.-]{1,127}$"


class RemotingKeys(BaseModel):
    remoting_listen: str | None = None  # None: no remoting server
    remoting_advertise: str | None = None  # "ip:port" clients are told; None: the listen address
    remoting_broker_name: str = Field("mqstore", pattern=_NAME)
    remoting_cluster: str = Field("DefaultCluster", pattern=_NAME)
    remoting_broker_id: int | None = Field(None, ge=0, le=JAVA_INT_MAX)
    remoting_max_frame_bytes: int = Field(16 << 20, ge=64 << 10, le=16 << 20)
    remoting_max_connections: int = Field(1024, ge=1, le=65_536)
    remoting_max_in_flight: int = Field(256, ge=1, le=65_536)
    remoting_max_held_pulls: int = Field(16_384, ge=0, le=1 << 20)
    remoting_max_long_polling_ms: int = Field(30_000, ge=0, le=JAVA_INT_MAX)
    remoting_client_idle_ms: int = Field(120_000, ge=1000, le=JAVA_INT_MAX)
    remoting_slave_read_enable: bool = False
    namesrv_addr: str | None = None  # "host:port;host:port"

    @field_validator("remoting_advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                host = parse_host(value)
            except ValueError as exc:
                raise ValueError(f"server.remoting_advertise {value!r}: {exc}; it must be "
                                 f"'ip:port' (offset message ids carry the address)") from None
            if host.port == 0:
                raise ValueError(f"server.remoting_advertise {value!r}: port 0 cannot be "
                                 f"dialled")
        return value

    @field_validator("namesrv_addr")
    @classmethod
    def _namesrv(cls, value: str | None) -> str | None:
        if value is not None:
            entries = [a.strip() for a in value.split(";") if a.strip()]
            if not entries:
                raise ValueError(f"server.namesrv_addr {value!r} names no NameServer; give "
                                 f"'host:port', several separated by ';'")
            for entry in entries:
                if parse_listen(entry)[1] == 0:
                    raise ValueError(f"server.namesrv_addr entry {entry!r}: port 0 cannot be "
                                     f"dialled")
        return value


def check_broker_id(role: str, broker_id: int | None) -> None:
    """RocketMQ's brokerId: 0 is the master, any other id a slave (a NameServer routes writes
    to id 0 only); ValueError when ``store.role`` says otherwise."""
    if broker_id is None:
        return
    if role == "slave" and broker_id == 0:
        raise ValueError("server.remoting_broker_id 0 is the master's id, but store.role is "
                         "'slave': give the slave an id > 0 (or leave it null for 1)")
    if role != "slave" and broker_id != 0:
        raise ValueError(f"server.remoting_broker_id {broker_id} is a slave's id, but "
                         f"store.role is {role!r}: a master's id is 0 (or leave it null)")


__all__ = ["RemotingKeys", "check_broker_id"]
