"""A process whose descriptors are all used up, serving HTTP: ``python fd_hog_server.py LIMIT``.

It lowers its RLIMIT_NOFILE to LIMIT, starts ``mqstore.ops.http_server.HttpServer`` (a
one-line WSGI app, no connection cap to speak of) on 127.0.0.1, then opens /dev/null until
``open`` fails, so that every accept fails with EMFILE, as in a store process whose own files
took every descriptor. It prints the port; on a line on stdin it lets the descriptors go and
prints ``released``; it closes the server and exits when stdin ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys

from mqstore.config import ServerSection
from mqstore.ops.http_server import HttpServer, Limits


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


async def main(limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    server = HttpServer(app, "127.0.0.1", 0, Limits.of(ServerSection(max_connections=10_000)))
    await server.start()
    hoard = []
    while True:
        try:
            hoard.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    loop = asyncio.get_running_loop()
    print(server.port, flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for fd in hoard:
        os.close(fd)
    print("released", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await server.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(int(sys.argv[1])))
