"""The access-key check: RocketMQ 5 clients sign every call with their Credentials.

Each call carries ``x-mq-date-time`` and ``authorization: MQv2-HMAC-SHA1 Credential=<access
key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret key, date-time)>``. With
keys configured (``server.grpc_access_keys`` for MessagingService, ``server.grpc_admin_keys``
for the admin service: separate settings, so a client key is never an admin) a call is served
only when its access key is one of them, the signature matches that key's secret, and the
signed date-time (``yyyyMMdd'T'HHmmss'Z'``, UTC) is within ``server.grpc_signature_skew_ms``
of the server's clock; otherwise it gets UNAUTHORIZED (40100). RocketMQ's proxy checks no
skew; without one a signature, once seen, would be good forever. The Python client formats its
local time with the ``Z`` of UTC, so a Python client off UTC must run with ``TZ=UTC`` (or the
window be widened by its offset).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
from typing import Mapping

from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"  # RocketMQ's yyyyMMdd'T'HHmmss'Z'
DEFAULT_SKEW_MS = 15 * 60_000


def now_date_time() -> str:
    """The current time as a signed call carries it."""
    return dt.datetime.now(dt.timezone.utc).strftime(DATE_TIME_FORMAT)


def signed_at(date_time: str) -> float:
    """Epoch seconds of ``x-mq-date-time``; UNAUTHORIZED naming the format otherwise."""
    try:
        when = dt.datetime.strptime(date_time, DATE_TIME_FORMAT)
    except ValueError:
        raise EndpointError(Code.UNAUTHORIZED, f"{DATE_TIME} {date_time[:40]!r} is not "
                                               f"yyyyMMddTHHmmssZ (UTC)") from None
    return when.replace(tzinfo=dt.timezone.utc).timestamp()


def sign(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def signed_metadata(access_key: str, secret_key: str, date_time: str) -> list[tuple[str, str]]:
    """The headers a call signed as the RocketMQ clients sign theirs (``mqstore topic|group
    --server`` signs its admin calls so)."""
    return [(DATE_TIME, date_time),
            (AUTHORIZATION, f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, "
                            f"Signature={sign(secret_key, date_time)}")]


def parse_authorization(value: str) -> dict[str, str]:
    """``MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=h, Signature=s`` -> its fields."""
    algorithm, _sep, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise EndpointError(Code.UNAUTHORIZED, f"authorization {algorithm!r} is not "
                                               f"{ALGORITHM}")
    fields = {}
    for part in rest.split(","):
        name, sep, field = part.strip().partition("=")
        if sep:
            fields[name] = field
    return fields


class AccessKeys:
    """The configured access keys; ``check(metadata)`` raises UNAUTHORIZED unless the call is
    signed by one of them within ``skew_ms`` of ``clock`` (epoch seconds). Without keys every
    call passes."""

    def __init__(self, keys: Mapping[str, str], skew_ms: int = DEFAULT_SKEW_MS,
                 clock=time.time, setting: str = "server.grpc_access_keys") -> None:
        self._keys = dict(keys)
        self._skew_s = skew_ms / 1000.0
        self._clock = clock
        self.setting = setting

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, metadata: Mapping[str, str]) -> str | None:
        """The caller's access key (None when no keys are configured)."""
        if not self._keys:
            return None
        header = metadata.get(AUTHORIZATION)
        date_time = metadata.get(DATE_TIME)
        if not header or not date_time:
            raise EndpointError(Code.UNAUTHORIZED, f"the call carries no {AUTHORIZATION} and "
                                                   f"{DATE_TIME} headers: this endpoint needs "
                                                   f"an access key and secret key of "
                                                   f"{self.setting}")
        self._check_fresh(date_time)
        fields = parse_authorization(header)
        access_key = fields.get("Credential", "").split("/")[0]
        secret = self._keys.get(access_key)
        if secret is None:
            raise EndpointError(Code.UNAUTHORIZED, f"access key {access_key[:64]!r} is not one "
                                                   f"of {self.setting}")
        if DATE_TIME not in fields.get("SignedHeaders", "").lower().split(";"):
            raise EndpointError(Code.UNAUTHORIZED, f"the signature must cover {DATE_TIME}")
        if not hmac.compare_digest(sign(secret, date_time), fields.get("Signature", "").lower()):
            raise EndpointError(Code.UNAUTHORIZED, f"the signature of access key "
                                                   f"{access_key!r} does not match its secret "
                                                   f"key")
        return access_key

    def _check_fresh(self, date_time: str) -> None:
        off = signed_at(date_time) - self._clock()
        if abs(off) > self._skew_s:
            raise EndpointError(Code.UNAUTHORIZED, (
                f"{DATE_TIME} {date_time} is {abs(off):.0f} s {'ahead of' if off > 0 else 'behind'}"
                f" this server's clock (UTC); a signature is good for "
                f"{self._skew_s:g} s either way (server.grpc_signature_skew_ms): check the "
                f"client's clock, and run a Python client with TZ=UTC (it signs its local "
                f"time as UTC)"))


class AdminAccess:
    """Who may call the admin service: the signers of ``admin_keys`` when there are any; with
    none, anyone when the endpoint checks no client keys either (serve allows that only on a
    loopback address: ``server.check_exposure``), nobody when it does (a client key is never an
    admin)."""

    def __init__(self, admin_keys: AccessKeys, client_keys: AccessKeys) -> None:
        self.admin_keys = admin_keys
        self._client_keys = client_keys

    @property
    def open(self) -> bool:
        return not self.admin_keys.enabled and not self._client_keys.enabled

    def describe(self, served: bool) -> str:
        if not served:
            return "off"
        if self.admin_keys.enabled:
            return "admin keys checked"
        return "open (loopback)" if self.open else "closed (no admin keys)"

    def check(self, metadata: Mapping[str, str]) -> None:
        if self.admin_keys.enabled:
            self.admin_keys.check(metadata)
        elif self._client_keys.enabled:
            raise EndpointError(Code.UNAUTHORIZED, (
                "this endpoint checks access keys (server.grpc_access_keys) but has no admin "
                "keys: client keys do not open the admin service; set server.grpc_admin_keys"))


__all__ = ["AccessKeys", "AdminAccess", "sign", "signed_metadata", "parse_authorization",
           "now_date_time", "signed_at"]
