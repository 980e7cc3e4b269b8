"""A WSGI application called once per request by ``http_server``: the PEP 3333 environ of an
h11 request without a body, and the application's answer as one status, headers and body
(the endpoints' answers are small and whole; nothing is streamed)."""

from __future__ import annotations

import io
import logging
import sys
from urllib.parse import unquote

import h11

log = logging.getLogger(__name__)


def call_wsgi(app, environ: dict) -> tuple[int, str, list, bytes]:
    """``(status, reason, headers, body)`` of ``app``; 500 when it raises (logged in one
    line, the traceback at debug level)."""
    started: list = []
    written: list[bytes] = []

    def start_response(status, headers, exc_info=None):
        started[:] = [status, headers]
        return written.append

    try:
        result = app(environ, start_response)
        try:
            body = b"".join([*written, *result])
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        code, _, reason = started[0].partition(" ")
        return int(code), reason, list(started[1]), body
    except Exception as exc:  # the server goes on; the client learns it failed
        log.error("%s %s failed: %r", environ["REQUEST_METHOD"], environ["PATH_INFO"], exc)
        log.debug("%s %s failed", environ["REQUEST_METHOD"], environ["PATH_INFO"],
                  exc_info=True)
        return 500, "Internal Server Error", [("Content-Type", "text/plain")], \
            b"internal error\n"


def wsgi_environ(request: h11.Request, server_name: str, server_port: int, peer) -> dict:
    """The PEP 3333 environ of ``request`` (which has no body)."""
    path, _, query = request.target.decode("latin-1").partition("?")
    environ = {
        "REQUEST_METHOD": request.method.decode("ascii"),
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote(path, encoding="latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": server_name,
        "SERVER_PORT": str(server_port),
        "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
        "REMOTE_ADDR": peer[0] if peer else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        text = value.decode("latin-1")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ
