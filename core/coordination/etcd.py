"""etcd through its JSON gateway (``etcd3gw``): the calls coordination makes, over a list of
endpoints, with the gateway's traps handled here and nowhere else.

NOTE [ The JSON gateway's traps ]
etcd 3.5's gateway (``/v3/...``) speaks protobuf's JSON mapping: keys and values are base64,
int64s (revisions, lease ids, TTLs) are strings, and a field at its default is omitted. So a
txn whose compares failed has no ``succeeded`` at all, a range that found nothing has no
``kvs``, and a keepalive on a lease that expired answers 200 with no ``TTL`` and no error.
Every answer is read through ``_int`` and ``.get`` here, so a missing field means its default
and never a KeyError in a coordination thread.

An ``EtcdClient`` is used by one thread at a time (each of coordination's threads has its
own: a ``requests`` session is not shared). A call tries the endpoint that answered last, then
the others in order, within one time budget (``retry_timeout``); a call that is not idempotent
(a txn) is never sent twice, since a timeout leaves its outcome unknown: the caller reads what
happened instead. Unreachable everywhere: ``CoordinationUnavailable``, naming every endpoint
and its failure. etcd answering with an error: ``CoordinationError`` naming the endpoint.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from mqstore.errors import CoordinationError, CoordinationUnavailable

try:  # the ha extra; a store without coordination runs without it
    import requests
    from etcd3gw.client import Etcd3Client
    from etcd3gw.exceptions import (
        ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception, InternalServerError,
    )
except ImportError as exc:
    _MISSING: ImportError | None = exc
else:
    _MISSING = None
    _TRANSPORT = (ConnectionFailedError, ConnectionTimeoutError, InternalServerError)

CONNECT_TIMEOUT_S = 1.0  # a live endpoint accepts at once; a dead host should not eat the budget


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def _int(value: Any) -> int:
    return int(value) if value not in (None, "") else 0


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def of(cls, kv: dict) -> "KeyValue":
        return cls(_unb64(kv.get("key", "")).decode("utf-8", "replace"),
                   _unb64(kv.get("value", "")), _int(kv.get("create_revision")),
                   _int(kv.get("mod_revision")), _int(kv.get("lease")))


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


# -- txn building blocks -----------------------------------------------------------------------
def absent(key: str) -> dict:
    """The key does not exist (its create revision is 0)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def unchanged(key: str, mod_revision: int) -> dict:
    """The key was not written since ``mod_revision`` (0: it still does not exist)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL",
            "mod_revision": str(mod_revision)}


def holds(key: str, value: bytes) -> dict:
    """The key exists and holds ``value`` (a missing key fails a value compare)."""
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def put(key: str, value: bytes, lease: int = 0) -> dict:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def delete(key: str) -> dict:
    return {"request_delete_range": {"key": b64(key)}}


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.removeprefix("http://").rstrip("/").rpartition(":")
    return host.strip("[]"), int(port)


class EtcdClient:
    """``endpoints``: ``"host:port"`` of etcd's client URLs (plain HTTP); ``budget_s``: how
    long one call may take over all of them (``retry_timeout``)."""

    def __init__(self, endpoints: Sequence[str], budget_s: float) -> None:
        if _MISSING is not None:
            raise CoordinationError(f"coordination.etcd_endpoints needs the ha extra (pip "
                                    f"install 'mqstore[ha]'): {_MISSING}")
        if not endpoints:
            raise CoordinationError("no etcd endpoint given: list at least one \"host:port\"")
        self.endpoints = tuple(endpoints)
        self.budget_s = budget_s
        self._clients = []
        for text in self.endpoints:
            host, port = _endpoint(text)
            self._clients.append(Etcd3Client(host, port, api_path="/v3/"))
        self._current = 0

    @property
    def endpoint(self) -> str:
        """The endpoint that answered last (or will be tried first)."""
        return self.endpoints[self._current]

    def close(self) -> None:
        for client in self._clients:
            client.session.close()

    # -- the calls -----------------------------------------------------------------------------
    def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: ``(id, granted TTL)``; etcd may grant more than asked (its minimum
        follows its election timeout), never less."""
        out = self._call("lease/grant", {"TTL": str(ttl_s), "ID": "0"}, idempotent=False)
        return _int(out.get("ID")), _int(out.get("TTL"))

    def keepalive(self, lease: int, budget_s: float | None = None) -> int | None:
        """Renew ``lease`` to its full TTL: the TTL, or None when etcd no longer has it (it
        expired or was revoked: the gateway says so only by leaving out the TTL)."""
        out = self._call("lease/keepalive", {"ID": str(lease)}, budget_s=budget_s)
        ttl = _int(out.get("result", {}).get("TTL"))
        return ttl if ttl > 0 else None

    def revoke(self, lease: int) -> bool:
        """Revoke ``lease`` (its keys go in one revision); False when etcd had no such lease."""
        try:
            self._call("lease/revoke", {"ID": str(lease)})
        except CoordinationError as exc:
            if "lease not found" in str(exc):
                return False
            raise
        return True

    def range(self, key: str, prefix: bool = False) -> tuple[int, list[KeyValue]]:
        """``(revision read at, keys)``: ``key`` alone, or every key starting with it."""
        body: dict[str, Any] = {"key": b64(key)}
        if prefix:
            end = bytearray(key.encode())
            end[-1] += 1
            body["range_end"] = b64(bytes(end))
        out = self._call("kv/range", body)
        return (_int(out.get("header", {}).get("revision")),
                [KeyValue.of(kv) for kv in out.get("kvs", ())])

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write ``key``; the revision it was written at. Retried on another endpoint: only
        for values that may be written twice (a member's own record)."""
        out = self._call("kv/put", put(key, value, lease)["request_put"])
        return _int(out.get("header", {}).get("revision"))

    def txn(self, compare: Iterable[dict], success: Iterable[dict],
            failure: Iterable[dict] = ()) -> TxnResult:
        """All ``compare`` hold: ``success`` runs, else ``failure``, atomically. Sent once:
        on CoordinationUnavailable the outcome is unknown and the caller must read it."""
        out = self._call("kv/txn", {"compare": list(compare), "success": list(success),
                                    "failure": list(failure)}, idempotent=False)
        return TxnResult(bool(out.get("succeeded", False)),
                         _int(out.get("header", {}).get("revision")))

    def wait_change(self, key: str, after_revision: int, wait_s: float) -> bool:
        """Whether ``key`` changed after ``after_revision`` (a watch from the next revision,
        so a change between the read and the watch is not missed), waiting up to ``wait_s``;
        True also when etcd compacted that history away (read again)."""
        index = self._current
        client = self._clients[index]
        body = {"create_request": {"key": b64(key), "start_revision": str(after_revision + 1)}}
        started = time.monotonic()
        try:
            with client.session.post(client.get_url("watch"), json=body, stream=True,
                                     timeout=(CONNECT_TIMEOUT_S, wait_s)) as resp:
                if resp.status_code != 200:
                    raise self._refused(index, resp.text)
                for line in resp.iter_lines():
                    result = json.loads(line).get("result", {}) if line.strip() else {}
                    if result.get("events") or result.get("canceled") or \
                            _int(result.get("compact_revision")):
                        return True
                    if time.monotonic() - started >= wait_s:
                        return False
        except requests.RequestException as exc:
            if time.monotonic() - started >= wait_s * 0.9:
                return False  # the read timeout: nothing changed
            self._current = (index + 1) % len(self._clients)  # the next call tries another
            raise CoordinationUnavailable(f"etcd at {self.endpoints[index]} dropped a watch of "
                                          f"{key}: {_reason(exc)}") from None
        return False

    # -- transport -----------------------------------------------------------------------------
    def _call(self, path: str, body: dict, *, idempotent: bool = True,
              budget_s: float | None = None) -> dict:
        budget = self.budget_s if budget_s is None else max(budget_s, 0.05)
        deadline = time.monotonic() + budget
        failures = []
        for step in range(len(self._clients)):
            index = (self._current + step) % len(self._clients)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            client = self._clients[index]
            client.timeout = (min(CONNECT_TIMEOUT_S, left), left)
            try:
                out = client.post(client.get_url(path), json=body)
            except _TRANSPORT as exc:
                failures.append(f"{self.endpoints[index]}: {_reason(exc)}")
                if not idempotent:
                    self._current = (index + 1) % len(self._clients)
                    break
                continue
            except Etcd3Exception as exc:
                raise self._refused(index, exc.detail_text or str(exc)) from None
            except ValueError as exc:  # not JSON: not an etcd gateway
                raise CoordinationError(f"etcd at {self.endpoints[index]} answered {path} with "
                                        f"something other than JSON: {exc}") from None
            self._current = index
            return out if isinstance(out, dict) else {}
        tried = "; ".join(failures) or f"no time left of the {budget:.3g} s budget"
        raise CoordinationUnavailable(f"etcd unreachable for {path} ({tried})")

    def _refused(self, index: int, text: str) -> CoordinationError:
        try:
            message = json.loads(text).get("message") or text
        except ValueError:
            message = text
        return CoordinationError(f"etcd at {self.endpoints[index]} refused the call: "
                                 f"{str(message).strip()[:300]}")


def _reason(exc: BaseException) -> str:
    text = exc.detail_text if isinstance(exc, Etcd3Exception) and exc.detail_text else str(exc)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower() or isinstance(exc, (ConnectionTimeoutError,
                                                       requests.Timeout)):
        return "timed out"
    return (text.strip() or type(exc).__name__)[:200]


__all__ = ["EtcdClient", "KeyValue", "TxnResult", "absent", "unchanged", "holds", "put",
           "delete", "b64"]
