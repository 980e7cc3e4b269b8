"""Who may be a slave (a master's side) and what a slave proves (a slave's side), from the
``server.ha_*`` keys. docs/replication.md ("Who may connect") states the rules:

    server.ha_allow         addresses / networks whose connections may speak RocketMQ's classic
                            protocol (no handshake): RocketMQ's own slaves, known by address
    server.ha_secret_file   a shared secret: a slave proves it knows it in mqstore's handshake
                            (``format.ha_hello``), and the master proves it back
    server.ha_tls_*         TLS with certificates from one CA on both ends; a slave speaks the
                            handshake inside it

With none of them, a master takes classic slaves from loopback addresses only (the
configuration refuses such a master listening beyond loopback: ``config``). A slave with a
secret or TLS speaks the handshake; without, the classic protocol (a RocketMQ master's).
Secrets and key files are read here, when replication starts: a missing or short one is a
ConfigError naming the key, never a value.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

from mqstore.errors import ConfigError

SECRET_MIN_BYTES = 16
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class HAAccess:
    allow: tuple[IPNetwork, ...] = ()
    secret: bytes | None = None
    tls: ssl.SSLContext | None = None

    @classmethod
    def for_master(cls, server) -> "HAAccess":
        return cls(tuple(ipaddress.ip_network(a, strict=False) for a in server.ha_allow),
                   _secret(server.ha_secret_file), _tls(server, server_side=True))

    @classmethod
    def for_slave(cls, server) -> "HAAccess":
        return cls((), _secret(server.ha_secret_file), _tls(server, server_side=False))

    @property
    def handshake(self) -> bool:
        """Whether peers speak mqstore's handshake (a secret or TLS is configured)."""
        return self.secret is not None or self.tls is not None

    @property
    def loopback_only(self) -> bool:
        """Nothing configured: a master takes classic slaves on this host only."""
        return not self.allow and not self.handshake

    def admits(self, addr: IPAddress | None) -> bool:
        """Whether a connection from ``addr`` may go on past the accept: to prove itself in
        the handshake, or to speak the classic protocol from an allowed address."""
        return self.handshake or self.classic_ok(addr)

    def classic_ok(self, addr: IPAddress | None) -> bool:
        """Whether ``addr`` may speak the classic protocol, unauthenticated."""
        if self.tls is not None or addr is None:
            return False
        if self.loopback_only:
            return addr.is_loopback
        return any(addr in net for net in self.allow if net.version == addr.version)

    def describe(self) -> str:
        """How slaves are admitted, for the log (never a secret)."""
        ways = []
        if self.allow:
            ways.append("classic protocol from " + ", ".join(map(str, self.allow)))
        elif self.loopback_only:
            ways.append("classic protocol from loopback addresses only")
        if self.handshake:
            proof = " and ".join(p for p, on in (("a TLS client certificate", self.tls),
                                                 ("the shared secret", self.secret)) if on)
            ways.append(f"mqstore's handshake proving {proof}")
        return "; ".join(ways)


def peer_address(host: str) -> IPAddress | None:
    """The IP address of an accepted peer (an IPv4-mapped IPv6 address as IPv4)."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _secret(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read(1 << 16).strip()
    except OSError as exc:
        raise ConfigError(f"server.ha_secret_file {path!r} cannot be read: "
                          f"{exc.strerror or exc}") from None
    if len(secret) < SECRET_MIN_BYTES:
        raise ConfigError(f"server.ha_secret_file {path!r} holds {len(secret)} bytes (less "
                          f"surrounding white space): a shared secret needs at least "
                          f"{SECRET_MIN_BYTES} (e.g. `openssl rand -hex 32`)")
    return secret


def _tls(server, *, server_side: bool) -> ssl.SSLContext | None:
    if server.ha_tls_cert_file is None:
        return None
    purpose = ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    key = "server.ha_tls_ca_file"
    try:
        context.load_verify_locations(cafile=server.ha_tls_ca_file)
        key = "server.ha_tls_cert_file"
        context.load_cert_chain(server.ha_tls_cert_file, server.ha_tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        path = server.ha_tls_ca_file if key.endswith("ca_file") else server.ha_tls_cert_file
        raise ConfigError(f"{key} {path!r} (with server.ha_tls_key_file for the "
                          f"certificate): cannot load it: {exc}") from None
    # The slave checks the master's certificate names the host it dials (the client
    # context's default); the master asks every slave for a certificate from the same CA.
    context.verify_mode = ssl.CERT_REQUIRED
    if server_side:
        context.num_tickets = 0  # no resumption: every connection shows its certificate
    return context


__all__ = ["HAAccess", "peer_address", "SECRET_MIN_BYTES"]
