"""A process whose descriptors are all used up, listening as the remoting server does:
``python remoting_fd_hog.py LIMIT``.

It lowers its RLIMIT_NOFILE to LIMIT, starts ``mqstore.remoting.listener.Listener`` on
127.0.0.1 with a cap far above the limit (so that accept itself fails, not the cap), for a
protocol that greets each connection with ``ok``, then opens /dev/null until ``open`` fails,
as in a store process whose own files took every descriptor. It prints the port; on a line on
stdin it lets the descriptors go and prints ``released``; it closes and exits when stdin ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys
from concurrent.futures import ThreadPoolExecutor  # noqa: F401 - imported before the hoard

from mqstore.remoting.listener import Listener


class Greeting(asyncio.Protocol):
    open: set = set()

    def connection_made(self, transport) -> None:
        self.open.add(self)
        transport.write(b"ok\n")

    def connection_lost(self, exc) -> None:
        self.open.discard(self)


async def main(limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    listener = Listener("127.0.0.1", 0, 100_000, Greeting, lambda: len(Greeting.open))
    listener.start()
    hoard = []
    while True:
        try:
            hoard.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    loop = asyncio.get_running_loop()
    print(listener.port, flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for fd in hoard:
        os.close(fd)
    print("released", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    listener.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(int(sys.argv[1])))
