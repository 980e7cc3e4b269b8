"""The access-key check: RocketMQ 5 clients sign every call with their Credentials.

Each call carries ``x-mq-date-time`` and ``authorization: MQv2-HMAC-SHA1 Credential=<access
key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret key, date-time)>``. With
``server.grpc_access_keys`` set, a call is served only when its access key is one of them and
the signature matches that key's secret; otherwise it gets UNAUTHORIZED (40100). The date-time
is what the client signed, not checked against the clock: the Python client formats its local
time with a ``Z`` suffix, so a skew check would refuse every client east or west of UTC.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Mapping

from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"


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
    signed by one of them. Without keys every call passes."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._keys = dict(keys)

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
                                                   f"the client's access key and secret key")
        fields = parse_authorization(header)
        access_key = fields.get("Credential", "").split("/")[0]
        secret = self._keys.get(access_key)
        if secret is None:
            raise EndpointError(Code.UNAUTHORIZED, f"access key {access_key!r} is not one "
                                                   f"this endpoint knows")
        if DATE_TIME not in fields.get("SignedHeaders", "").lower().split(";"):
            raise EndpointError(Code.UNAUTHORIZED, f"the signature must cover {DATE_TIME}")
        if not hmac.compare_digest(sign(secret, date_time), fields.get("Signature", "").lower()):
            raise EndpointError(Code.UNAUTHORIZED, f"the signature of access key "
                                                   f"{access_key!r} does not match its secret "
                                                   f"key")
        return access_key


__all__ = ["AccessKeys", "sign", "signed_metadata", "parse_authorization"]
