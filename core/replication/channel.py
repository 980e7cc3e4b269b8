"""A replication connection's byte stream, plaintext or TLS, for one reader thread and one
writer thread at once (a master's connection has both).

NOTE [ TLS from two threads ]
OpenSSL's connection objects must not be used by two threads at the same time, and
``ssl.SSLSocket`` does not serialise them. ``TlsChannel`` runs OpenSSL over memory buffers
(``ssl.SSLObject``): the sockets are read and written outside any lock, the SSL object is
touched only under ``_ssl_lock``, and bytes it produced leave in the order it produced them
(``_send_lock`` is taken before ``_ssl_lock`` is released). A blocking send never holds the SSL
lock, so a stalled peer blocks the writer, never the reader's processing of acknowledgements.

``recv`` answers None when the peer closed, and ``b""`` when bytes arrived that do not yet
complete a TLS record.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time

RAW_RECV_BYTES = 256 * 1024


def readable(sock: socket.socket, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


def close_socket(sock: socket.socket) -> None:
    """Shut down and close, whatever state the peer left the connection in."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class PlainChannel:
    tls = False

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def wait_readable(self, timeout_s: float) -> bool:
        return readable(self.sock, timeout_s)

    def recv(self, n: int) -> bytes | None:
        data = self.sock.recv(n)
        return data or None

    def sendall(self, data) -> None:
        self.sock.sendall(data)

    def peer_certificate(self) -> str | None:
        return None

    def close(self) -> None:
        close_socket(self.sock)


class TlsChannel:
    tls = True

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None) -> None:
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=server_side,
                                     server_hostname=server_hostname)
        self._ssl_lock = threading.Lock()
        self._send_lock = threading.Lock()
        # Whether the incoming buffer may hold a whole record not yet decrypted (records that
        # arrived with the handshake's last message, or past what a recv took).
        self._undrained = False

    def handshake(self, deadline: float) -> None:
        """TLS's own handshake, by ``deadline`` (``time.monotonic``): TimeoutError after it,
        ssl.SSLError for a certificate the context refuses, ConnectionError when closed."""
        while True:
            with self._ssl_lock:
                try:
                    self._obj.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                except ssl.SSLError:
                    self._send_alert()  # the peer learns why (a certificate refused)
                    raise
                out = self._take_output()
            self._send(out)
            if done:
                return
            if not readable(self.sock, deadline - time.monotonic()):
                raise TimeoutError("the TLS handshake did not complete in time")
            raw = self.sock.recv(RAW_RECV_BYTES)
            if not raw:
                raise ConnectionError("the peer closed the connection during the TLS handshake")
            with self._ssl_lock:
                self._in.write(raw)
                self._undrained = True

    def wait_readable(self, timeout_s: float) -> bool:
        with self._ssl_lock:
            if self._obj.pending() or (self._undrained and self._in.pending):
                return True
        return readable(self.sock, timeout_s)

    def recv(self, n: int) -> bytes | None:
        try:
            with self._ssl_lock:
                buffered = self._read_plain(n)
            if buffered:
                return buffered
            if not readable(self.sock, 0):
                return b""  # the buffered bytes end inside a record
            raw = self.sock.recv(RAW_RECV_BYTES)
            if not raw:
                return None
            with self._ssl_lock:
                self._in.write(raw)
                self._undrained = True
                data = self._read_plain(n)
                out = self._take_output()
        except ssl.SSLZeroReturnError:  # the peer's close_notify
            return None
        self._send(out)
        return data

    def sendall(self, data) -> None:
        with self._ssl_lock:
            view = memoryview(data)
            while view:
                view = view[self._obj.write(view):]
            out = self._take_output()
        self._send(out)

    def peer_certificate(self) -> str | None:
        """The peer certificate's subject, as ``CN=...`` (for the log)."""
        cert = self._obj.getpeercert()
        if not cert:
            return None
        return ", ".join(f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn)

    def close(self) -> None:
        close_socket(self.sock)

    # -- under _ssl_lock -----------------------------------------------------------------------
    def _read_plain(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            try:
                chunk = self._obj.read(n - got)
            except ssl.SSLWantReadError:
                self._undrained = False
                break
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _send_alert(self) -> None:
        try:
            self.sock.sendall(self._out.read())
        except OSError:
            pass

    def _take_output(self) -> bytes:
        out = self._out.read()
        if out:
            self._send_lock.acquire()  # released by _send, after the bytes left in order
        return out

    def _send(self, out: bytes) -> None:
        if not out:
            return
        try:
            self.sock.sendall(out)
        finally:
            self._send_lock.release()


Channel = PlainChannel | TlsChannel

__all__ = ["PlainChannel", "TlsChannel", "Channel", "readable", "close_socket"]
