"""A process whose descriptors are all used up, listening as serve does:
``python fd_hog.py http|remoting LIMIT``.

It lowers its RLIMIT_NOFILE to LIMIT and starts on 127.0.0.1, with a connection cap far above
the limit (so that accept itself fails, not the cap), either ``http``:
``mqstore.ops.http_server.HttpServer`` with a one-line WSGI app answering ``ok``, or
``remoting``: ``mqstore.remoting.listener.Listener`` for a protocol that greets each
connection with ``ok``. Then it opens /dev/null until ``open`` fails, as in a store process
whose own files took every descriptor, so that every accept fails with EMFILE. It prints the
port; on a line on stdin it lets the descriptors go and prints ``released``; it closes and
exits when stdin ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys
from concurrent.futures import ThreadPoolExecutor  # noqa: F401 - imported before the hoard

from mqstore.config import ServerSection
from mqstore.ops.http_server import HttpServer, Limits
from mqstore.remoting.listener import Listener


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


class Greeting(asyncio.Protocol):
    open: set = set()

    def connection_made(self, transport) -> None:
        self.open.add(self)
        transport.write(b"ok\n")

    def connection_lost(self, exc) -> None:
        self.open.discard(self)


async def http_server():
    server = HttpServer(app, "127.0.0.1", 0, Limits.of(ServerSection(max_connections=10_000)))
    await server.start()
    return server.port, server.close


async def remoting_listener():
    listener = Listener("127.0.0.1", 0, 100_000, Greeting, lambda: len(Greeting.open))
    listener.start()

    async def close() -> None:
        listener.close()
    return listener.port, close


SERVERS = {"http": http_server, "remoting": remoting_listener}


async def main(kind: str, limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    port, close = await SERVERS[kind]()
    hoard = []
    while True:
        try:
            hoard.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    loop = asyncio.get_running_loop()
    print(port, flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for fd in hoard:
        os.close(fd)
    print("released", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
