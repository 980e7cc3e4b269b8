"""``mqstore serve``'s section (its HTTP endpoints, the gRPC endpoint, replication's addresses
and who may connect) and the coordination section (automatic failover on etcd)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mqstore.config.remoting import RemotingKeys
from mqstore.config.sections import _Section
from mqstore.config.values import JAVA_INT_MAX, parse_listen


class ServerSection(_Section, RemotingKeys):
    """``mqstore serve``: where the metrics and health endpoints listen, what a client may hold
    there (connections, time, header bytes), how much it logs and how (text or JSON lines),
    the RocketMQ 5 gRPC endpoint (``grpc_*``, docs/endpoint.md), replication's addresses
    (``ha_*``, docs/replication.md) and RocketMQ 4.x's broker port (``remoting_*``,
    ``namesrv_addr``: ``config.remoting``)."""

    metrics_listen: str = "127.0.0.1:9108"
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["text", "json"] = "text"  # json: one object per line, for shippers
    max_connections: int = Field(64, ge=1, le=65_536)
    idle_timeout_ms: int = Field(10_000, ge=1, le=86_400_000)
    request_timeout_ms: int = Field(10_000, ge=1, le=86_400_000)
    max_header_bytes: int = Field(16_384, ge=1024, le=1 << 20)
    grpc_listen: str | None = None  # None: no gRPC endpoint
    grpc_tls_cert_file: str | None = None
    grpc_tls_key_file: str | None = None
    grpc_access_keys: tuple[str, ...] = ()  # "ACCESS_KEY:SECRET_KEY" each
    grpc_max_request_bytes: int = Field(8 * 1024 * 1024, ge=4096, le=JAVA_INT_MAX)
    grpc_max_concurrent_streams: int = Field(1024, ge=1, le=JAVA_INT_MAX)
    grpc_max_concurrent_rpcs: int = Field(8192, ge=1, le=JAVA_INT_MAX)
    grpc_max_connections: int = Field(1024, ge=1, le=JAVA_INT_MAX)
    grpc_client_idle_ms: int = Field(120_000, ge=1000, le=JAVA_INT_MAX)
    grpc_min_invisible_ms: int = Field(10_000, ge=0, le=JAVA_INT_MAX)
    grpc_max_long_polling_ms: int = Field(20_000, ge=0, le=JAVA_INT_MAX)
    grpc_push_invisible_ms: int = Field(60_000, ge=1000, le=12 * 3600 * 1000)
    grpc_signature_skew_ms: int = Field(15 * 60_000, ge=1000, le=JAVA_INT_MAX)
    grpc_admin_enabled: bool = True
    grpc_admin_keys: tuple[str, ...] = ()  # "ACCESS_KEY:SECRET_KEY" each, for the admin service
    grpc_peer_max_new_topics: int = Field(1000, ge=0, le=JAVA_INT_MAX)
    grpc_peer_max_new_groups: int = Field(1000, ge=0, le=JAVA_INT_MAX)
    grpc_max_unwritten_bytes: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    grpc_max_unwritten_bytes_per_connection: int = Field(32 << 20, ge=1 << 16, le=1 << 40)
    grpc_write_stall_ms: int = Field(30_000, ge=100, le=JAVA_INT_MAX)
    ha_listen: str | None = None  # a master's replication port (RocketMQ: broker port + 1)
    ha_master: str | None = None  # the master's ha_listen, which a slave dials
    # The other nodes' ha_listen: a master asks them, before it takes puts and then every
    # heartbeat, whether one of them became master after it (docs/replication.md).
    ha_peers: tuple[str, ...] = ()
    # Who may be a slave (docs/replication.md, "Who may connect"): classic slaves by address,
    # mqstore slaves by a shared secret and/or TLS client certificates.
    ha_allow: tuple[str, ...] = ()  # "10.0.0.2", "10.0.0.0/24", "fd00::/64"
    ha_secret_file: str | None = None
    ha_tls_cert_file: str | None = None
    ha_tls_key_file: str | None = None
    ha_tls_ca_file: str | None = None

    @field_validator("metrics_listen", "grpc_listen", "ha_listen", "remoting_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @field_validator("ha_master")
    @classmethod
    def _master(cls, value: str | None) -> str | None:
        if value is not None and parse_listen(value)[1] == 0:
            raise ValueError(f"master address {value!r}: port 0 cannot be dialled; give the "
                             f"port the master's server.ha_listen binds")
        return value

    @field_validator("ha_peers")
    @classmethod
    def _peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for peer in value:
            if parse_listen(peer)[1] == 0:
                raise ValueError(f"server.ha_peers entry {peer!r}: port 0 cannot be dialled; "
                                 f"give the port the peer's server.ha_listen binds")
        return value

    @field_validator("grpc_access_keys", "grpc_admin_keys", "ha_allow", "ha_peers",
                     mode="before")
    @classmethod
    def _key_list(cls, value):
        return tuple(value) if isinstance(value, list) else value  # YAML gives lists

    @field_validator("ha_allow")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"server.ha_allow entry {entry!r} must be an IP address or a "
                                 f"network in CIDR form ('10.0.0.2', '10.0.0.0/24', "
                                 f"'fd00::/64'); host names are not resolved") from None
        return value

    @model_validator(mode="after")
    def _ha_tls(self) -> "ServerSection":
        tls = {"ha_tls_cert_file": self.ha_tls_cert_file,
               "ha_tls_key_file": self.ha_tls_key_file, "ha_tls_ca_file": self.ha_tls_ca_file}
        if len({v is None for v in tls.values()}) > 1:
            given = ", ".join(f"server.{k} ({v!r})" for k, v in tls.items())
            raise ValueError(f"{given} go together: give all three for TLS between master "
                             f"and slaves (a certificate, its key, and the CA that signed "
                             f"the other end's), or none")
        if self.ha_tls_cert_file is not None and self.ha_allow:
            raise ValueError(
                f"server.ha_allow ({list(self.ha_allow)}) admits RocketMQ's classic slaves, "
                f"which speak no TLS, but server.ha_tls_* makes the port speak only TLS: use "
                f"one or the other")
        if self.ha_peers and self.ha_secret_file is None and self.ha_tls_cert_file is None:
            raise ValueError(
                f"server.ha_peers ({list(self.ha_peers)}) needs server.ha_secret_file or "
                f"server.ha_tls_*: nodes tell each other their epochs in mqstore's handshake, "
                f"which only a secret or TLS turns on")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> "ServerSection":
        if (self.grpc_tls_cert_file is None) != (self.grpc_tls_key_file is None):
            raise ValueError(
                f"server.grpc_tls_cert_file ({self.grpc_tls_cert_file!r}) and "
                f"server.grpc_tls_key_file ({self.grpc_tls_key_file!r}) go together: give both "
                f"for TLS, or neither for plaintext")
        for key in ("grpc_access_keys", "grpc_admin_keys"):
            for i, pair in enumerate(getattr(self, key)):
                # The message names the access key at most: a secret never goes to a log.
                access_key, sep, secret_key = pair.partition(":")
                if not sep or not access_key or not secret_key:
                    what = (f"access key {access_key!r} has an empty secret key" if access_key
                            and sep else f"entry {i} has no access key before a ':'")
                    raise ValueError(f"server.{key}: {what}; each entry is "
                                     f"'ACCESS_KEY:SECRET_KEY', both non-empty")
        if self.grpc_max_unwritten_bytes_per_connection > self.grpc_max_unwritten_bytes:
            raise ValueError(
                f"server.grpc_max_unwritten_bytes_per_connection "
                f"({self.grpc_max_unwritten_bytes_per_connection}) cannot exceed "
                f"server.grpc_max_unwritten_bytes ({self.grpc_max_unwritten_bytes})")
        return self


WILDCARDS = ("0.0.0.0", "::", "")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class CoordinationSection(_Section):
    """Automatic failover on etcd (``mqstore.coordination``; docs/replication.md, "Automatic
    failover with etcd"): a leader key under a lease, fencing, epochs, elections. Empty
    ``etcd_endpoints``: no coordination, and promotion stays a manual step."""

    etcd_endpoints: tuple[str, ...] = ()  # "host:port" of etcd's client URLs
    cluster: str = "mqstore"
    node: str | None = None
    lease_ttl_s: int = Field(5, ge=2, le=3600)  # etcd grants whole seconds, 2 at least
    renew_interval_ms: int = Field(1_000, ge=10, le=3_600_000)
    retry_timeout_ms: int = Field(1_500, ge=10, le=3_600_000)
    safety_margin_ms: int = Field(1_000, ge=100, le=3_600_000)
    priority: int = Field(1, ge=0, le=JAVA_INT_MAX)
    max_lag_bytes: int = Field(0, ge=0)
    # What the other nodes dial to follow this one when it leads (default: server.ha_listen,
    # which then must name a host, not a wildcard).
    ha_address: str | None = None

    @field_validator("etcd_endpoints", mode="before")
    @classmethod
    def _endpoint_list(cls, value):
        return tuple(value) if isinstance(value, list) else value  # YAML gives lists

    @field_validator("etcd_endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            if parse_listen(text)[1] == 0:
                raise ValueError(f"etcd endpoint {text!r}: port 0 cannot be dialled; give the "
                                 f"port of etcd's client URL (2379 by default)")
        return value

    @field_validator("ha_address")
    @classmethod
    def _dialable(cls, value: str | None) -> str | None:
        if value is not None and (parse_listen(value)[1] == 0
                                  or parse_listen(value)[0].strip("[]") in WILDCARDS):
            raise ValueError(f"coordination.ha_address {value!r}: other nodes dial it to follow "
                             f"this one; give a host they reach and the port of "
                             f"server.ha_listen")
        return value

    @field_validator("cluster", "node")
    @classmethod
    def _name(cls, value: str | None, info) -> str | None:
        if value is not None and not _NODE_NAME.fullmatch(value):
            raise ValueError(f"{info.field_name} {value!r} must be 1 to 64 letters, digits, "
                             f"'.', '_' or '-', starting with a letter or digit (it is part "
                             f"of etcd keys)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CoordinationSection":
        if self.etcd_endpoints and self.node is None:
            raise ValueError("coordination.node is not set but coordination.etcd_endpoints is: "
                             "each node of the cluster needs its own name")
        # Two renewal attempts, each bounded by the retry timeout, fit before the write
        # deadline (Patroni's loop_wait + 2 * retry_timeout <= ttl, with our margin taken off).
        room = self.lease_ttl_s * 1000 - self.safety_margin_ms
        need = self.renew_interval_ms + 2 * self.retry_timeout_ms
        if need > room:
            raise ValueError(
                f"coordination.renew_interval_ms ({self.renew_interval_ms}) + 2 * "
                f"coordination.retry_timeout_ms ({self.retry_timeout_ms}) = {need} must not "
                f"exceed coordination.lease_ttl_s ({self.lease_ttl_s} s) - "
                f"coordination.safety_margin_ms ({self.safety_margin_ms}) = {room} ms: a "
                f"leader must get two renewal attempts in before its write deadline")
        return self
